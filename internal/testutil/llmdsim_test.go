package testutil

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestStartLLMDSim starts the foreign engine (skipped where its binary is absent) and reads the
// model it serves from /v1/models, as a gateway would.
func TestStartLLMDSim(t *testing.T) {
	s := StartLLMDSim(t, "probe-model", "--zmq-endpoint", "")
	resp, err := http.Get(s.URL + "/v1/models")
	if err != nil {
		t.Fatalf("models: %v", err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decode models: %v", err)
	}
	if len(body.Data) == 0 || body.Data[0].ID != "probe-model" {
		t.Fatalf("models = %+v, want probe-model (engine output: %s)", body.Data, s.Output())
	}
	s.Stop()
	s.Stop()
}
