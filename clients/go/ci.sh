#!/usr/bin/env bash
# CI for the Go client, run from the repository root: bash clients/go/ci.sh
# Needs Go 1.22 or later and target/release/batond (cargo build --release),
# or BATON_BATOND naming a batond binary. staticcheck runs when it is
# installed or installs from the module proxy (go install
# honnef.co/go/tools/cmd/staticcheck@latest); otherwise it is skipped.
set -euo pipefail
cd "$(dirname "$0")"
export GOFLAGS="${GOFLAGS:--mod=mod}"
export BATON_BATOND="${BATON_BATOND:-$(cd ../.. && pwd)/target/release/batond}"
if [ ! -x "$BATON_BATOND" ]; then
    echo "clients/go/ci.sh: no batond at $BATON_BATOND (cargo build --release first)" >&2
    exit 1
fi

echo "== gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
    echo "not gofmt-clean:" >&2
    echo "$unformatted" >&2
    exit 1
fi

echo "== go vet"
go vet ./...

staticcheck=$(command -v staticcheck || true)
gobin="$(go env GOPATH)/bin/staticcheck"
if [ -z "$staticcheck" ] && [ ! -x "$gobin" ]; then
    # From the module proxy, if it can be reached; skipped otherwise.
    timeout 300 go install honnef.co/go/tools/cmd/staticcheck@latest >/dev/null 2>&1 || true
fi
if [ -z "$staticcheck" ] && [ -x "$gobin" ]; then
    staticcheck="$gobin"
fi
if [ -n "$staticcheck" ]; then
    echo "== staticcheck"
    "$staticcheck" ./...
else
    echo "== staticcheck not installed; skipped"
fi

echo "== go build (the conformance driver)"
go build -o ../../target/go/baton-driver ./cmd/baton-driver

echo "== go test -race"
timeout 600 go test -race -count=1 -timeout 300s ./...
