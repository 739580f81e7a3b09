#!/usr/bin/env bash
# What the tests use besides what pip installs:
# - Debian's prometheus, which tests/api/test_prometheus.py starts to scrape two replicas;
# - Debian's chromium, the headless browser tests/api/test_webui.py drives the web page with
#   (through Playwright, launched on this executable, so Playwright downloads no browser);
# - the Claude Code CLI (npm's @anthropic-ai/claude-code, and Node.js for it), which
#   tests/agents/test_messages_api.py runs headless against the server, pinned: tests/data/claude_code
#   holds this version's own requests (scripts/capture_claude_code.py captures them again when
#   the pin moves);
# - the OpenAI Codex CLI, pinned (npm's @openai/codex@$CODEX_VERSION: tests/data/codex holds
#   the requests this version sends), which tests/agents/test_codex_cli.py runs against the server.
#
# As root on Debian (CI), installs what is missing (apt-get, then npm). Elsewhere it says what
# to install and goes on: those tests then skip with the same message, except under CI
# (CI set), where they fail. Always exits 0, so the README's test command carries on to pytest.
set -u

CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0

as_root_with_apt() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1
}

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    # --no-install-recommends: only what is named (for prometheus: no node exporter; the
    # package's own service is not needed, the test starts its own on a free loopback port)
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install_debian_packages() {
    local missing=()
    command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    [ ${#missing[@]} -eq 0 ] && return
    if as_root_with_apt; then
        if apt_install "${missing[@]}"; then
            echo "install_test_deps: installed ${missing[*]}" >&2
            return
        fi
        echo "install_test_deps: apt-get could not install ${missing[*]}" >&2
    else
        echo "install_test_deps: ${missing[*]} not installed; 'sudo apt-get install ${missing[*]}' lets tests/api/test_prometheus.py and tests/api/test_webui.py run" >&2
    fi
}

# npm_install PACKAGE COMMAND TEST: PACKAGE installed globally with npm (nodejs and npm from
# apt-get where npm is missing), or a line saying what TEST needs
npm_install() {
    local package=$1 command=$2 test=$3
    if ! command -v npm >/dev/null 2>&1 && as_root_with_apt; then
        apt_install nodejs npm || echo "install_test_deps: apt-get could not install nodejs and npm" >&2
    fi
    if command -v npm >/dev/null 2>&1 && [ -w "$(npm prefix -g 2>/dev/null || echo /nonexistent)" ]; then
        if npm install -g --silent "$package" >/dev/null 2>&1 && command -v "$command" >/dev/null 2>&1; then
            echo "install_test_deps: installed $package ($("$command" --version 2>/dev/null))" >&2
            return
        fi
        echo "install_test_deps: npm could not install $package" >&2
    else
        echo "install_test_deps: $package is not installed; 'npm install -g $package' lets $test run it" >&2
    fi
}

install_claude_code() {
    claude --version 2>/dev/null | grep -q "^$CLAUDE_CODE_VERSION " && return
    npm_install "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" claude tests/agents/test_messages_api.py
}

install_codex() {
    [ "$(codex --version 2>/dev/null)" = "codex-cli $CODEX_VERSION" ] && return
    npm_install "@openai/codex@$CODEX_VERSION" codex tests/agents/test_codex_cli.py
}

install_debian_packages
install_claude_code
install_codex
exit 0
