package configs

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/pipetrain/pipetrain/data"
)

// SetData sets keys of the data section from the command line (pipetrain
// evaluate's --data), each setting "data.KEY=VALUE" or "KEY=VALUE": VALUE
// is read as YAML reads it in the file (8 an integer, val.bin a string), and
// a path is taken from the config's folder as the file's and PIPETRAIN_*
// variables' are. A key of the data section's own fields or of the dataset
// kind's own keys (data.val_shards for tokens) is accepted; any other is
// refused by name. It beats the file and the variables. Call it between
// LoadUnchecked and Validate: a problem Validate then finds with such a key
// starts with the setting as given, as one from a variable names the
// variable.
func (c *Config) SetData(settings []string) error {
	for _, s := range settings {
		key, value, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("--data %s: want KEY=VALUE, e.g. data.val_shards=val.bin", s)
		}
		name := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(key), "data."))
		if err := c.setData(name, value); err != nil {
			return fmt.Errorf("--data %s: %w", s, err)
		}
		if c.env == nil {
			c.env = map[string]string{}
		}
		c.env["data."+name] = "--data " + s
	}
	return nil
}

// setData sets key name of the data section to value, read as YAML.
func (c *Config) setData(name, value string) error {
	v := reflect.ValueOf(&c.Data).Elem()
	var known []string
	for i := range v.NumField() {
		k, ok := keyName(v.Type().Field(i))
		if !ok {
			continue
		}
		if k == name {
			if err := yaml.Unmarshal([]byte(value), v.Field(i).Addr().Interface()); err != nil {
				return fmt.Errorf("data.%s: %q is no %s", name, value, v.Field(i).Type())
			}
			return nil
		}
		known = append(known, k)
	}
	for _, k := range data.KeysOf(c.Data.Dataset) {
		if k.Key == name {
			var x any
			if err := yaml.Unmarshal([]byte(value), &x); err != nil {
				return fmt.Errorf("data.%s: %w", name, err)
			}
			if c.Data.Own == nil {
				c.Data.Own = map[string]any{}
			}
			c.Data.Own[name] = x
			return nil
		}
		known = append(known, k.Key)
	}
	msg := fmt.Sprintf("data.%s is no key of the data section of dataset %s", name, c.Data.Dataset)
	if near := nearest(name, slices.Clone(known)); near != "" {
		msg += fmt.Sprintf(" (did you mean data.%s?)", near)
	}
	return fmt.Errorf("%s", msg)
}
