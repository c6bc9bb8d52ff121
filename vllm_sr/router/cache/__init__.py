"""The response cache: keys, answers, stores."""
