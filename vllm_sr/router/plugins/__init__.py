"""Per-decision plugins applied to a routed chat."""
