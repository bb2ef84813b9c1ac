#!/usr/bin/env bash
# Installs what Stateplane's commands need when it is missing: a Rust toolchain check, and
# the Debian packages named as arguments, each as COMMAND or COMMAND:PACKAGE when the
# package is named otherwise (e.g. tshark valgrind ping:iputils-ping). Safe to re-run.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || { echo "error: cargo not found; install Rust (https://rustup.rs) and re-run" >&2; exit 1; }
# Rust 1.85 or later: the workspace is edition 2024.
rust=$(rustc --version 2>/dev/null | awk '{print $2}')
[ -n "$rust" ] || { echo "error: rustc not found beside cargo; install Rust (https://rustup.rs) and re-run" >&2; exit 1; }
IFS=. read -r major minor _ <<<"${rust:-0.0.0}"
if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 85 ]; }; then
  echo "error: Rust ${rust:-not found} is older than 1.85, which Stateplane needs (edition 2024): run \`rustup update stable\`" >&2
  exit 1
fi

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
