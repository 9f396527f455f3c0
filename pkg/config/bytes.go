package config

import (
	"fmt"

	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// Bytes is a byte count written in TOML either as an integer (17179869184)
// or as a quantity string ("16GiB", "16384MiB", "16GB"; see
// quantity.ParseBytes).
type Bytes uint64

// UnmarshalTOML implements toml.Unmarshaler.
func (b *Bytes) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case int64:
		if v < 0 {
			return fmt.Errorf("negative byte count %d", v)
		}
		*b = Bytes(v)
		return nil
	case string:
		n, err := quantity.ParseBytes(v)
		if err != nil {
			return err
		}
		*b = Bytes(n)
		return nil
	default:
		return fmt.Errorf(`want an integer number of bytes or a quantity string such as "16GiB", not %s`, tomlTypeName(v))
	}
}

// String writes b exactly, in the largest fitting binary unit ("16GiB").
func (b Bytes) String() string { return quantity.FormatBytes(uint64(b)) }

// MarshalText writes b as String does, so that encoders (TOML, JSON) produce
// what a person would write in the file.
func (b Bytes) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText reads a quantity string, the inverse of MarshalText.
func (b *Bytes) UnmarshalText(text []byte) error {
	n, err := quantity.ParseBytes(string(text))
	if err != nil {
		return err
	}
	*b = Bytes(n)
	return nil
}

// tomlTypeName names the TOML type of a decoded value for error messages.
func tomlTypeName(v any) string {
	switch v.(type) {
	case int64:
		return "an integer"
	case string:
		return "a string"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case []any, []map[string]any:
		return "an array"
	case map[string]any:
		return "a table"
	case nil:
		return "nothing"
	default:
		return fmt.Sprintf("a date or time (%T)", v)
	}
}
