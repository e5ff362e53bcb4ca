// Package bench holds what kvgate's two measuring instruments share: the seeded workloads, the
// arrival processes, the per-request records and their summaries, the report formats (table, JSON,
// PNG charts), the goodput sweep, and the live driver that runs a workload against any
// OpenAI-compatible endpoint over HTTP. The fleet simulator (internal/fleet) runs the same
// workloads in virtual time and reports through the same Summary, so a live row and a simulated
// row are comparable column by column.
//
// A workload is a deterministic function of its seed: session k has the same text whatever the
// order in which sessions are started or finish, so two runs with one seed send the same bytes.
//
// # Files, by concern
//
//   - workload*.go: what is offered. The Workload interface and the synthetic workloads
//     (workload.go), Spec (a workload from its knobs), the arrival processes and limits, the
//     ideal hit rate, and the schedule of worker changes (failover) a run makes.
//   - trace_*.go: recorded and generated traces: kvgate's JSONL format, the Mooncake format
//     (parser, writer, replay) and its generator.
//   - driver_*.go: the live driver: HTTP requests, SSE parsing, and failover through the
//     gateway's admin API.
//   - report*.go: what is measured: records and summaries, the text and JSON reports, the
//     timelines and recoveries, the goodput sweep, and the PNG charts.
//
// Nothing here imports the fleet simulator; it imports this package.
package bench
