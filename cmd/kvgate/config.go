package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// applyConfigFile sets, from the YAML file at path, every flag not given on the command line.
// Keys are the flag names (snake_case is accepted too); lists are written as YAML sequences.
// An unknown key is an error, so a typo never passes silently.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := strings.ReplaceAll(k, "_", "-")
		if name == "config" {
			return fmt.Errorf("--config %s: a config file cannot name another", path)
		}
		if fs.Lookup(name) == nil {
			return fmt.Errorf("--config %s: unknown key %q", path, k)
		}
		if set[name] {
			continue // the command line wins
		}
		val, err := configValue(doc[k])
		if err != nil {
			return fmt.Errorf("--config %s: key %q: %w", path, k, err)
		}
		if err := fs.Set(name, val); err != nil {
			return fmt.Errorf("--config %s: key %q: %w", path, k, err)
		}
	}
	return nil
}

func configValue(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case []any:
		parts := make([]string, 0, len(x))
		for _, e := range x {
			s, err := configValue(e)
			if err != nil {
				return "", err
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ","), nil
	case map[string]any:
		return "", fmt.Errorf("a mapping is not a flag value")
	default:
		return fmt.Sprint(x), nil
	}
}
