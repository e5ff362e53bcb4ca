// Package deploy holds kvgate's Kubernetes manifests, Helm chart and Grafana dashboard; its tests
// decode every manifest and the rendered chart strictly into the Kubernetes API types.
//
// deploy is a Go module of its own (github.com/kvgate/kvgate/deploy), so that Helm, which only
// these tests need, is no dependency of the gateway: run its tests with
// `cd deploy && go test ./...` (.ci/run does).
package deploy
