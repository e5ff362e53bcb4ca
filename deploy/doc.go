// Package deploy holds kvgate's Kubernetes manifests, Helm chart and Grafana dashboard; its tests
// decode every manifest and the rendered chart strictly into the Kubernetes API types.
//
// deploy is a Go module of its own (github.com/kvgate/kvgate/deploy), so that Helm, which only
// these tests need, is no dependency of the gateway: run its tests with
// `cd deploy && go test ./...` (.ci/run does). They render the chart with Helm's own engine and
// values.schema.json, as `helm template` does, so they are the chart's lint in CI; with a helm
// binary, `helm lint --strict deploy/helm/kvgate` passes too (one can be built from the same
// module: `go install helm.sh/helm/v3/cmd/helm@v3.22.0`).
package deploy
