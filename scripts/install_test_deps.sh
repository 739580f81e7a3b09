#!/usr/bin/env bash
# The Debian packages the tests use besides what pip installs: Debian's prometheus, which
# tests/test_prometheus.py starts to scrape two replicas.
#
# As root on Debian (CI), installs it with apt-get when it is missing. Elsewhere it says what
# to install and goes on: that test then skips with the same message, except under CI
# (CI set), where it fails. Always exits 0, so the README's test command carries on to pytest.
set -u

if command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    # --no-install-recommends: the server only (no node exporter); the package's own service
    # is not needed, the test starts its own prometheus on a free loopback port
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; then
        echo "install_test_deps: installed $(prometheus --version 2>&1 | head -n 1)" >&2
        exit 0
    fi
    echo "install_test_deps: apt-get could not install prometheus" >&2
else
    echo "install_test_deps: prometheus is not installed; 'sudo apt-get install prometheus' lets tests/test_prometheus.py run" >&2
fi
exit 0
