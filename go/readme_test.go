package warden_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every Go block of README.md and the Go pages (docs/clients/go*.md) is the
// body of an Example function (which go test runs), verbatim.
func TestDocSnippetsAreExamples(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string]string{}
	for _, m := range regexp.MustCompile(`(?s)func (Example\w*)\(\) \{\n(.*?)\t// Output:`).FindAllStringSubmatch(string(src), -1) {
		lines := strings.Split(strings.TrimRight(m[2], "\n"), "\n")
		for i, l := range lines {
			lines[i] = strings.TrimPrefix(l, "\t")
		}
		bodies[m[1]] = strings.Join(lines, "\n")
	}
	block := regexp.MustCompile("(?s)<!-- not run: go/readme_test.go checks it is (Example\\w*)[^>]*-->\n```go\n(.*?)\n```")
	pages, err := filepath.Glob("../docs/clients/go*.md")
	if err != nil || len(pages) < 2 {
		t.Fatalf("the Go pages: %v %v", pages, err)
	}
	for _, page := range append([]string{"../README.md"}, pages...) {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		found := block.FindAllStringSubmatch(string(text), -1)
		if n := strings.Count(string(text), "```go\n"); n == 0 || n != len(found) {
			t.Fatalf("%s: %d Go blocks, %d marked as an Example's body", page, n, len(found))
		}
		for _, m := range found {
			if bodies[m[1]] != m[2] {
				t.Errorf("%s: the block marked %s is not its body:\n%s\n--- want ---\n%s", page, m[1], m[2], bodies[m[1]])
			}
		}
	}
}
