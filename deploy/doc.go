// Package deploy holds kvgate's Kubernetes manifests, Helm chart and Grafana dashboard; its tests
// decode every manifest and the rendered chart strictly into the Kubernetes API types.
package deploy
