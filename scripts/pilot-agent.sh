#!/usr/bin/env bash
# Builds Istio's pilot-agent for the sidecar tests and prints its path (see istio-tool.sh).
exec bash "$(dirname "${BASH_SOURCE[0]}")/istio-tool.sh" pilot-agent
