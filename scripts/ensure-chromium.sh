#!/usr/bin/env bash
# Make sure Debian's Chromium is at /usr/bin/chromium for the browser tests.
# Quiet and quick when it is already there; installs it with apt-get when we are root;
# never downloads a browser from anywhere else (no `playwright install`).
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-chromium: $CHROMIUM is missing and we are not root, so install it yourself (sudo apt-get install chromium) or skip the browser tests with 'make test-fast'." >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: $CHROMIUM is missing and this machine has no apt-get, so install Chromium by hand at $CHROMIUM or skip the browser tests with 'make test-fast'." >&2
    exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
       && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "ensure-chromium: apt-get could not install the Debian package 'chromium' (log tail above)." >&2
    exit 1
fi

if [ ! -x "$CHROMIUM" ]; then
    echo "ensure-chromium: apt-get installed 'chromium' but $CHROMIUM is still missing." >&2
    exit 1
fi
echo "ensure-chromium: installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)."
