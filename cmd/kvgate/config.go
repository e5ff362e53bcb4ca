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
	// Values are read as the text written, never as YAML's guess at a type: "admin-key: 0x1F"
	// is the key 0x1F, not the number 31.
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	if len(root.Content) == 0 {
		return nil // an empty file
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return fmt.Errorf("--config %s: want a mapping of flag names to values", path)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	values := map[string]*yaml.Node{}
	keys := make([]string, 0, len(doc.Content)/2)
	for i := 0; i+1 < len(doc.Content); i += 2 {
		k := doc.Content[i].Value
		if _, dup := values[k]; dup {
			return fmt.Errorf("--config %s: key %q is given twice", path, k)
		}
		values[k] = doc.Content[i+1]
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := strings.ReplaceAll(k, "_", "-")
		if name == "config" {
			return fmt.Errorf("--config %s: a config file cannot name another", path)
		}
		if fs.Lookup(name) == nil {
			return fmt.Errorf("--config %s: unknown key %q%s", path, k, didYouMean(name, flagNames(fs), ""))
		}
		if set[name] {
			continue // the command line wins
		}
		val, err := configValue(values[k])
		if err != nil {
			return fmt.Errorf("--config %s: key %q: %w", path, k, err)
		}
		if err := fs.Set(name, val); err != nil {
			return fmt.Errorf("--config %s: key %q: %w", path, k, err)
		}
	}
	return nil
}

// configValue is a flag value as written in the file: a scalar's text, or a sequence's scalars
// joined by commas.
func configValue(n *yaml.Node) (string, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "", nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		parts := make([]string, 0, len(n.Content))
		for _, e := range n.Content {
			s, err := configValue(e)
			if err != nil {
				return "", err
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("a mapping is not a flag value")
}
