// Command runc-nosysresource is an OCI runtime for dockerd on kernels whose capability
// bounding set lacks CAP_SYS_RESOURCE (some microVMs): privileged containers ask for every
// capability and runc then fails with "unable to apply caps: operation not permitted".
// It removes CAP_SYS_RESOURCE from the bundle's config.json (create, run) and from the
// --process file (exec), then runs the real runc with the same arguments.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

const dropped = "CAP_SYS_RESOURCE"

func main() {
	runc := os.Getenv("PD_KIND_RUNC")
	if runc == "" {
		runc = "/usr/sbin/runc"
	}
	args := os.Args[1:]
	if cmd, rest := subcommand(args); cmd != "" {
		var err error
		switch cmd {
		case "create", "run":
			bundle := flagValue(rest, "bundle", "b")
			if bundle == "" {
				bundle = "."
			}
			err = rewrite(filepath.Join(bundle, "config.json"), true)
		case "exec":
			if p := flagValue(rest, "process", "p"); p != "" {
				err = rewrite(p, false)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "runc-nosysresource: %v\n", err)
			os.Exit(1)
		}
	}
	argv := append([]string{runc}, args...)
	if err := syscall.Exec(runc, argv, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "runc-nosysresource: exec %s: %v\n", runc, err)
		os.Exit(1)
	}
}

// subcommand returns the first argument that is not a global flag, and what follows it.
// Global flags that take a value are written --flag=value by dockerd and containerd, except
// --root, --log, --log-format and --criu, which may come as two words.
func subcommand(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return a, args[i+1:]
		}
		switch a {
		case "--root", "--log", "--log-format", "--criu", "--rootless":
			i++
		}
	}
	return "", nil
}

func flagValue(args []string, long, short string) string {
	for i, a := range args {
		for _, name := range []string{"--" + long, "-" + long, "-" + short} {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
	}
	return ""
}

// rewrite drops the capability from a config.json (the "process" object) or a process.json.
func rewrite(path string, bundle bool) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	proc := doc
	if bundle {
		p, ok := doc["process"].(map[string]any)
		if !ok {
			return nil
		}
		proc = p
	}
	caps, ok := proc["capabilities"].(map[string]any)
	if !ok {
		return nil
	}
	changed := false
	for set, v := range caps {
		list, ok := v.([]any)
		if !ok {
			continue
		}
		kept := list[:0]
		for _, c := range list {
			if c == dropped {
				changed = true
				continue
			}
			kept = append(kept, c)
		}
		caps[set] = kept
	}
	if !changed {
		return nil
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, info.Mode().Perm())
}
