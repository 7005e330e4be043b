#!/usr/bin/env bash
# The Debian packages some tests drive for real, installed when missing: Prometheus (scrapes the
# service, checks the alert rules), HAProxy (replicas behind a balancer), headless Chromium
# (the playground's browser test) and Node.js (the playground's modules run outside a browser).
# Needs root or sudo and apt-get; without them it says what to install and leaves the tests to
# fail with the same advice.
set -euo pipefail
PACKAGES=(prometheus haproxy chromium chromium-driver nodejs)
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo"; else
    echo "missing Debian packages for some tests: ${missing[*]} (apt-get install them as root)" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null; then
  echo "missing packages for some tests: ${missing[*]} (no apt-get here: install them another way)" >&2
  exit 0
fi
echo "installing Debian packages the tests use: ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
