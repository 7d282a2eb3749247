#!/usr/bin/env bash
# Install Debian's chromium for the headless browser test of the study report
# (tests/researcher/test_html_report.py: the HTML report and the MLflow run page as Chromium renders them).
# Idempotent: nothing to do when /usr/bin/chromium exists. Needs root (CI runs as root) and the network.
set -euo pipefail
start=$(date +%s)
if [ -x /usr/bin/chromium ]; then
  echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo '?')"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q chromium
echo "chromium installed in $(( $(date +%s) - start ))s: $(/usr/bin/chromium --version 2>/dev/null || echo '?')"
