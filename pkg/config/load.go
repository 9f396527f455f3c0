package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"

	"github.com/BurntSushi/toml"
)

// Parse reads a configuration from data over the defaults: keys the file
// leaves out keep their Default values. name is used in error messages
// ("name:line: key: problem") and becomes Config.Source. The result is
// validated; every problem found is returned, joined (see Error).
func Parse(name string, data []byte) (*Config, error) {
	var top map[string]toml.Primitive
	md, err := toml.Decode(string(data), &top)
	if err != nil {
		return nil, syntaxError(name, err)
	}
	cfg := Default()
	cfg.Source = name
	d := &decoder{md: &md, loc: locate(string(data)), file: name}
	d.fields(top, reflect.ValueOf(cfg).Elem(), "")
	if len(d.errs) > 0 {
		// Values that failed to decode would only add confusing
		// validation errors on top of the real ones.
		return nil, errors.Join(d.errs...)
	}
	if err := cfg.validate(d.loc); err != nil {
		return nil, err
	}
	return cfg, nil
}

// syntaxError keeps the library's line and column and names the file.
func syntaxError(name string, err error) error {
	var pe toml.ParseError
	if !errors.As(err, &pe) {
		return &Error{File: name, Err: err}
	}
	return &Error{
		File: name,
		Line: pe.Position.Line,
		Col:  pe.Position.Col,
		Err:  &causeError{msg: "invalid TOML: " + pe.Message, cause: err},
	}
}

// Load reads and parses the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// resolve names the config file to use: flagPath (--config) when set, else
// $NRI_VGPU_CONFIG when set, else DefaultPath; origin says where the path
// came from ("" for the default).
func resolve(flagPath string) (path, origin string) {
	if flagPath != "" {
		return flagPath, "--config"
	}
	if env := os.Getenv(EnvPath); env != "" {
		return env, "$" + EnvPath
	}
	return DefaultPath, ""
}

// LoadResolved loads the file resolve names. A file named by --config or
// $NRI_VGPU_CONFIG must exist; DefaultPath may be absent, in which case the
// defaults are returned with an empty Source.
func LoadResolved(flagPath string) (*Config, error) {
	path, origin := resolve(flagPath)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		return Parse(path, data)
	case origin == "" && errors.Is(err, fs.ErrNotExist):
		return Default(), nil
	case origin != "":
		return nil, fmt.Errorf("read config named by %s: %w", origin, err)
	default:
		return nil, fmt.Errorf("read config: %w", err)
	}
}
