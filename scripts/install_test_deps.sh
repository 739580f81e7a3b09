#!/usr/bin/env bash
# The Debian packages the tests use besides what pip installs: Debian's prometheus, which
# tests/test_prometheus.py starts to scrape two replicas, and Debian's chromium, the headless
# browser tests/test_webui.py drives the web page with (through Playwright, launched on this
# executable, so Playwright downloads no browser of its own).
#
# As root on Debian (CI), installs what is missing with apt-get. Elsewhere it says what to
# install and goes on: those tests then skip with the same message, except under CI (CI
# set), where they fail. Always exits 0, so the README's test command carries on to pytest.
set -u

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    # --no-install-recommends: prometheus without the node exporter (the test starts its own
    # on a free loopback port, not the package's service); chromium without extras
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        echo "install_test_deps: installed ${missing[*]}" >&2
        exit 0
    fi
    echo "install_test_deps: apt-get could not install ${missing[*]}" >&2
else
    echo "install_test_deps: ${missing[*]} not installed; 'sudo apt-get install ${missing[*]}' lets tests/test_prometheus.py and tests/test_webui.py run" >&2
fi
exit 0
