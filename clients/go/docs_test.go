package baton

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDocsGoExamples builds and runs every ```go block of the "## Go
// client" section of docs/clients.md as a user would: a module of its own
// that requires this one and replaces it with this checkout (the section's
// "Installing" instructions), the block pasted as it is printed into a
// function body, and a real batond to talk to. The block's text is the
// doc's byte for byte except for one substitution: the server addresses it
// names ("10.0.0.1:7373" and the like, any quoted host:7373) become the
// address of the batond the test started. Both of the first block's two
// addresses point at that one node, which the client then reaches over two
// connections.
//
// What a block uses but does not define (ctx, c, batches, writeBatch,
// steps, hostname) comes from prelude.go, a file of its own; the imports a
// block may need are in main.go, each used once above the block so that a
// block that needs fewer still compiles; and after the block the wrapper
// uses every name the block declares at its top level (the docs show some
// results without using them) and returns the block's err, if it declares
// one, else nil. main reports what the block returned; the test checks it
// against docExpect.
func TestDocsGoExamples(t *testing.T) {
	blocks := goDocBlocks(t, "../../docs/clients.md", "## Go client")
	if len(blocks) == 0 {
		t.Fatal(`docs/clients.md: no go blocks in the "## Go client" section`)
	}
	seen := map[string]bool{}
	for _, b := range blocks {
		seen[b.heading] = true
	}
	for h := range docExpect {
		if !seen[h] {
			t.Errorf("docExpect has %q, but no go block of the section comes under that heading", h)
		}
	}

	goCmd, err := exec.LookPath("go") // go test puts its own GOROOT/bin first on PATH
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range blocks {
		b := b
		t.Run(fmt.Sprintf("%d_%s", i+1, strings.ReplaceAll(b.heading, " ", "_")), func(t *testing.T) {
			t.Parallel()
			want, ok := docExpect[b.heading]
			if !ok {
				want = docWant{ctx: 30 * time.Second}
			}
			node := startNode(t, freeAddr(t))
			prog := buildDocExample(t, goCmd, self, b, node.addr)

			c, cancel := context.WithTimeout(context.Background(), want.ctx+30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(c, prog, node.addr, want.ctx.String())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			runErr := cmd.Run()
			t.Logf("docs/clients.md:%d, %s:\nstdout:\n%sstderr:\n%s", b.line, b.heading, stdout.String(), stderr.String())
			if c.Err() != nil {
				t.Fatalf("the example did not finish within %v", want.ctx+30*time.Second)
			}
			if runErr != nil {
				t.Fatalf("the example failed: %v", runErr)
			}
			wantLine := "example returned: " + want.returned
			if want.returned == "" {
				wantLine += "<nil>"
			}
			if !strings.Contains(stdout.String(), wantLine+"\n") {
				t.Errorf("the example's output lacks %q", wantLine)
			}
			for _, s := range want.output {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("the example's output lacks %q", s)
				}
			}
		})
	}
}

// docWant is what the test expects of the block under a heading.
type docWant struct {
	ctx      time.Duration // how long the prelude's ctx lasts
	returned string        // the error the wrapper returns ("" for nil)
	output   []string      // lines the program prints
}

// docExpect is keyed by the "### " heading a block comes under. A block
// under another heading must return nil within 30 s; an entry with no
// block under its heading fails the test, so none goes stale unnoticed.
var docExpect = map[string]docWant{
	// Nobody else holds "invoices": the block acquires it, writes every
	// batch fenced with the token and keeps the lease after each.
	"A lock around a job": {
		ctx:    30 * time.Second,
		output: []string{"wrote batch 1 with token ", "wrote batch 3 with token "},
	},
	// The held lock is not lost while the steps run; every one runs.
	"Held locks: a lease that keeps itself alive": {
		ctx:    30 * time.Second,
		output: []string{"step 1 ran with token ", "step 3 ran with token "},
	},
	// The block holds a slot of "encoders", watches it until a state
	// shows the slot taken, then stops the watch; it campaigns for
	// "scheduler" (nobody else does: it leads at once), reads the leader,
	// observes it, resigns and stops once nobody leads. Each step checks
	// its error, so a block that got there only by ctx ending (a loop that
	// ran until then) would return ctx's error, not nil.
	"Semaphores, watches and elections in Go": {
		ctx:    30 * time.Second,
		output: []string{"1 of 4 busy, 0 waiting\n", "leader: 10.0.0.5:8080\n", "nobody leads\n"},
	},
}

// docBlock is one ```go block of the docs.
type docBlock struct {
	heading string // the "### " heading it comes under
	line    int    // the line of its first line of code
	code    string
}

// goDocBlocks reads the ```go blocks of the section of path that starts
// at the line section and ends at the next "## " heading.
func goDocBlocks(t *testing.T, path, section string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out []docBlock
	in, found, heading := false, false, ""
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "## ") {
			if found && in {
				break
			}
			in = l == section
			found = found || in
			continue
		}
		if !in {
			continue
		}
		if strings.HasPrefix(l, "### ") {
			heading = strings.TrimPrefix(l, "### ")
		}
		if !strings.HasPrefix(l, "```") {
			continue
		}
		lang := strings.TrimSpace(strings.TrimPrefix(l, "```"))
		start := i + 1
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: a block that never ends", path, start)
		}
		if lang == "go" {
			out = append(out, docBlock{heading, start + 1, strings.Join(lines[start:i], "\n") + "\n"})
		}
	}
	if !found {
		t.Fatalf("%s: no line %q", path, section)
	}
	return out
}

// serverAddr is a server address the docs print: a quoted host:7373.
var serverAddr = regexp.MustCompile(`"[^"\s]+:7373"`)

// buildDocExample writes the block's program in a module of its own and
// builds it with go build, as a user of the docs would; it returns the
// binary, which takes the node's address and how long ctx lasts.
func buildDocExample(t *testing.T, goCmd, self string, b docBlock, addr string) string {
	t.Helper()
	dir := t.TempDir()
	env := append(os.Environ(),
		"GOFLAGS=-mod=mod", "GOWORK=off", "GOPROXY=off", "GOTOOLCHAIN=local")
	run := func(args ...string) {
		t.Helper()
		c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(c, goCmd, args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The section's "Installing": a require and a replace by the checkout.
	run("mod", "init", "example.com/docsexample")
	run("mod", "edit",
		"-require=github.com/baton-lock/baton/clients/go@v0.0.0",
		"-replace=github.com/baton-lock/baton/clients/go="+self)

	// The only substitution: the docs' server addresses become the node's
	// (the block is otherwise the doc's, byte for byte).
	code := serverAddr.ReplaceAllLiteralString(b.code, strconv.Quote(addr))
	names, hasErr := topLevelNames(t, b)
	var post strings.Builder
	post.WriteString("\t// The wrapper's, after the block: the block's own results, used.\n")
	for _, n := range names {
		fmt.Fprintf(&post, "\t_ = %s\n", n)
	}
	if hasErr {
		post.WriteString("\treturn err\n")
	} else {
		post.WriteString("\treturn nil\n")
	}
	main := fmt.Sprintf(docsMain, b.line, b.heading) + code + post.String() + "}\n"
	for name, text := range map[string]string{"main.go": main, "prelude.go": docsPrelude} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "example")
	run("build", "-o", bin, ".")
	return bin
}

// topLevelNames lists the names the block declares with := at its top
// level, and whether err is one of them.
func topLevelNames(t *testing.T, b docBlock) ([]string, bool) {
	t.Helper()
	src := "package p\nfunc f() error {\n" + b.code + "}\n"
	f, err := parser.ParseFile(token.NewFileSet(), "block.go", src, 0)
	if err != nil {
		t.Fatalf("docs/clients.md:%d: the block does not parse as a function body: %v", b.line, err)
	}
	set := map[string]bool{}
	for _, s := range f.Decls[0].(*ast.FuncDecl).Body.List {
		if a, ok := s.(*ast.AssignStmt); ok && a.Tok == token.DEFINE {
			for _, e := range a.Lhs {
				if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
					set[id.Name] = true
				}
			}
		}
	}
	var names []string
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, set["err"]
}

// docsMain is main.go up to the block: the imports a block may use, each
// used once here, and the function the block is the body of.
const docsMain = `// The go block of docs/clients.md at line %d (under "### %s"),
// written by TestDocsGoExamples in clients/go/docs_test.go.

package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	baton "github.com/baton-lock/baton/clients/go"
)

var (
	_ = context.Background
	_ = errors.Is
	_ = fmt.Println
	_ = log.Fatal
	_ = time.Second
	_ = baton.New
)

func example() error {
`

// docsPrelude is prelude.go: the stand-ins for what the blocks use but do
// not define, and main.
const docsPrelude = `package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	baton "github.com/baton-lock/baton/clients/go"
)

var (
	docsNodeAddr string // the batond the test started: os.Args[1]
	ctx          context.Context
	c            *baton.Client
	hostname     = "host-a"
	batches      = []int{1, 2, 3}
	steps        = []step{{1}, {2}, {3}}
)

func writeBatch(batch int, token uint64) {
	fmt.Printf("wrote batch %d with token %d\n", batch, token)
}

type step struct{ n int }

func (s step) Run(token uint64) {
	fmt.Printf("step %d ran with token %d\n", s.n, token)
}

func main() {
	docsNodeAddr = os.Args[1]
	life, err := time.ParseDuration(os.Args[2])
	if err != nil {
		log.Fatal(err)
	}
	var cancel context.CancelFunc
	ctx, cancel = context.WithTimeout(context.Background(), life)
	defer cancel()
	c, err = baton.New([]string{docsNodeAddr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Printf("example returned: %v\n", example())
}
`
