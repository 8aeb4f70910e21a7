package tollgate

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArchitectureListsEveryFile: ARCHITECTURE.md's table names every
// source file of the repository (Go and Lua, tests and test data aside)
// in the row of its package, and names no file that is not there.
func TestArchitectureListsEveryFile(t *testing.T) {
	b, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| (`?[a-z/]*`?|root)? ?\\| (.*?) \\| .* \\|$")
	name := regexp.MustCompile("`([a-z_]+\\.(?:go|lua))`")
	listed := map[string]bool{}
	pkg := ""
	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil || strings.HasPrefix(line, "|---") {
			continue
		}
		switch p := strings.Trim(m[1], "`"); p {
		case "":
		case "root":
			pkg = "."
		case "package":
			continue // the header
		default:
			pkg = p
		}
		for _, f := range name.FindAllStringSubmatch(m[2], -1) {
			path := filepath.Join(pkg, f[1])
			if _, err := os.Stat(path); err != nil {
				t.Errorf("ARCHITECTURE.md lists %s: %v", path, err)
			}
			listed[path] = true
		}
	}
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || strings.HasSuffix(path, "_test.go") || !(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".lua")) {
			return nil
		}
		if !listed[path] {
			t.Errorf("ARCHITECTURE.md's table does not list %s", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
