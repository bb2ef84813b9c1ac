#!/usr/bin/env bash
# Installs what Stateplane's commands need when it is missing: a Rust toolchain check, and
# the Debian packages named as arguments, each as COMMAND or COMMAND:PACKAGE when the
# package is named otherwise (e.g. tshark valgrind ping:iputils-ping). Safe to re-run.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || { echo "error: cargo not found; install Rust (https://rustup.rs) and re-run" >&2; exit 1; }

missing=()
for want in "$@"; do
  cmd=${want%%:*}
  pkg=${want#*:}
  # type -P finds files only: `command -v time` is satisfied by bash's keyword, and
  # /usr/bin/time was never installed.
  type -P "$cmd" >/dev/null || PATH="$PATH:/usr/sbin:/sbin" type -P "$cmd" >/dev/null || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; answer no without a prompt.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections 2>/dev/null || true
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
