#!/usr/bin/env bash
# Install what the site's browser tests need, Debian's chromium and chromium-driver, where this
# machine allows it (apt-get, as root). Exit status 0 when both are there afterwards.
set -uo pipefail
if command -v chromium > /dev/null && command -v chromedriver > /dev/null; then
  exit 0
fi
if ! command -v apt-get > /dev/null || [ "$(id -u)" != 0 ]; then
  echo "install_browser: needs apt-get as root; run: sudo apt-get install chromium chromium-driver" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
timeout 600 apt-get install -y -q chromium chromium-driver > /dev/null \
  || { timeout 600 apt-get update -q > /dev/null && timeout 600 apt-get install -y -q chromium chromium-driver > /dev/null; }
command -v chromium > /dev/null && command -v chromedriver > /dev/null
