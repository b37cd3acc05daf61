package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A doc is read as a script: the lines of its code blocks that start with
// "$ " are commands, each followed by the output the doc shows for it, and a
// code block whose first line is "# NAME" with NAME a file name (bad.yaml,
// mine.csv) writes that file for the commands after it.
type docStep struct {
	line    int
	command string   // "" for a file
	shown   []string // the output the doc shows
	file    string
	text    string
}

var fileHeader = regexp.MustCompile(`^# ([A-Za-z0-9_./-]+\.(yaml|yml|csv|txt))$`)

func readDoc(t *testing.T, path string) []docStep {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var steps []docStep
	var block []string
	start, in := 0, false
	for i, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			if in {
				steps = append(steps, blockSteps(start, block)...)
			}
			in, block, start = !in, nil, i+2
			continue
		}
		if in {
			block = append(block, line)
		}
	}
	return steps
}

func blockSteps(start int, block []string) []docStep {
	if len(block) > 0 {
		if m := fileHeader.FindStringSubmatch(block[0]); m != nil {
			return []docStep{{line: start, file: m[1], text: strings.Join(block, "\n") + "\n"}}
		}
	}
	var steps []docStep
	for i, line := range block {
		if c, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, docStep{line: start + i, command: c})
		} else if len(steps) > 0 {
			steps[len(steps)-1].shown = append(steps[len(steps)-1].shown, line)
		}
	}
	return steps
}

// expectsFailure reports whether the doc shows the command failing: its
// output starts with pipetrain's error prefix and never reports a finished
// run or an evaluation.
func (s docStep) expectsFailure() bool {
	if len(s.shown) == 0 || !strings.HasPrefix(s.shown[0], "pipetrain: ") {
		return false
	}
	for _, l := range s.shown {
		// A finished launch, and evaluate's report, print their results
		// on pipetrain: lines too.
		if strings.HasPrefix(l, "pipetrain: done:") || strings.HasPrefix(l, "pipetrain: evaluating ") {
			return false
		}
	}
	return true
}

var digits = regexp.MustCompile(`[+-]?[0-9][0-9.,]*`)

// skeleton is a line with its numbers masked and its spacing collapsed: the
// part of an output line that does not change from run to run.
func skeleton(line string) string {
	return strings.Join(strings.Fields(digits.ReplaceAllString(line, "#")), " ")
}

// TestDocumentedCommandsRun runs every command README.md and docs/*.md show,
// in order, in a scratch copy of the configs, shortened (6 steps where the
// command does not give --steps, no checkpoints): each must succeed, or fail
// where the doc shows it failing, and print every line the doc shows that
// holds no number, and most of the others with their numbers masked (see
// checkShown). Output of a shortened run, or of a command that
// reads one, is not held against the doc's.
func TestDocumentedCommandsRun(t *testing.T) {
	needData(t)
	bin := filepath.Dir(binary)
	docs, _ := filepath.Glob("../docs/*.md")
	docs = append([]string{"../README.md"}, docs...)
	ran := 0
	for _, doc := range docs {
		steps := readDoc(t, doc)
		if len(steps) == 0 {
			continue
		}
		t.Run(filepath.Base(doc), func(t *testing.T) {
			dir := scratchRepo(t)
			// Run directories trained for fewer steps than the doc shows:
			// what later commands print of them is not the doc's output.
			short := map[string]bool{}
			for _, s := range steps {
				where := filepath.Base(doc) + ":" + itoa(s.line)
				if s.file != "" {
					if err := os.WriteFile(filepath.Join(dir, s.file), []byte(s.text), 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				ran++
				out, err := runDocCommand(t, dir, bin, s.command)
				if failed := err != nil; failed != s.expectsFailure() {
					t.Errorf("%s: $ %s: error %v, the doc shows it %s:\n%s", where, s.command, err, map[bool]string{true: "failing", false: "succeeding"}[s.expectsFailure()], out)
					continue
				}
				if shortened(s.command, short) {
					continue
				}
				checkShown(t, where, s, out)
			}
		})
	}
	if ran < 10 {
		t.Errorf("ran %d documented commands; the docs show more", ran)
	}
}

var runDirFlag = regexp.MustCompile(`--run-dir[ =](\S+)`)

// shortened reports whether command trains fewer steps than the doc says
// (a run without --steps; it then joins short) or reads such a run.
func shortened(command string, short map[string]bool) bool {
	if m := runDirFlag.FindStringSubmatch(command); m != nil && !strings.Contains(command, "--steps") &&
		(strings.Contains(command, "pipetrain launch") || strings.Contains(command, "pipetrain reference")) {
		short[m[1]] = true
		return true
	}
	for d := range short {
		if strings.Contains(command, d) {
			return true
		}
	}
	return false
}

// variable reports whether a shown line holds what changes between runs:
// numbers, or a timeline's axis, whose length is the makespan's.
func variable(line string) bool {
	return digits.MatchString(line) || strings.Contains(line, "+---")
}

// checkShown holds a command's output against the doc's, line by line with
// numbers masked: a failure's lines and every line that does not vary must all
// be printed; of the rest (timelines and verdicts that move with the
// machine's timings) two thirds.
func checkShown(t *testing.T, where string, s docStep, out string) {
	t.Helper()
	var got []string
	for _, l := range strings.Split(out, "\n") {
		got = append(got, skeleton(l))
	}
	have := "\n" + strings.Join(got, "\n") + "\n"
	matched, total := 0, 0
	for _, l := range s.shown {
		l = strings.TrimSpace(l)
		if l == "" || l == "..." {
			continue
		}
		total++
		if strings.Contains(have, "\n"+skeleton(l)+"\n") {
			matched++
		} else if s.expectsFailure() || !variable(l) {
			t.Errorf("%s: $ %s: the doc shows %q, the program printed:\n%s", where, s.command, l, out)
		}
	}
	t.Logf("%s: %d of %d lines shown match", where, matched, total)
	if 3*matched < 2*total {
		t.Errorf("%s: $ %s: only %d of the %d lines the doc shows match the output (numbers aside):\n%s", where, s.command, matched, total, out)
	}
}

// runDocCommand runs a documented command line with bash in dir, pipetrain
// being the binary under test, shortened by environment: runs that do not
// say how many steps train 6, and write no checkpoints. `pipetrain
// validate` trains nothing and checks the config as the doc shows it.
func runDocCommand(t *testing.T, dir, bin, command string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", command)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	if !strings.HasPrefix(strings.TrimSpace(command), "pipetrain validate") {
		cmd.Env = append(cmd.Env, "PIPETRAIN_CHECKPOINT_EVERY=0")
		if !strings.Contains(command, "--steps") {
			cmd.Env = append(cmd.Env, "PIPETRAIN_TRAIN_STEPS=6")
		}
	}
	if strings.HasPrefix(command, "go ") {
		// A Go program of the repository's (go run ./examples/...) runs in
		// the module, as the doc's reader runs it, with the doc's settings.
		cmd.Dir, cmd.Env = "..", os.Environ()
	}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("$ %s: did not finish within 3 minutes:\n%s", command, buf.String())
	}
	return buf.String(), err
}

// scratchRepo is a directory laid out as the repository is for the docs'
// commands: a copy of configs/ and an empty docs/img/.
func scratchRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-r", "../configs", dir).CombinedOutput(); err != nil {
		t.Fatalf("copying configs: %v: %s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(dir, "docs", "img"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func itoa(n int) string {
	var b []byte
	for ; n > 0 || len(b) == 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestReadmeListsTheDefaultConfig holds the README's listing of the default
// config to the file itself, comments included: the listing is where a new
// user learns the keys, so it must be the file they will run.
func TestReadmeListsTheDefaultConfig(t *testing.T) {
	const intro = "`configs/fmnist-mlp-4stage.yaml`, the default:"
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(defaultConfig)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), intro)
	if !ok {
		t.Fatalf("README.md has no %q", intro)
	}
	_, after, ok = strings.Cut(after, "```yaml\n")
	listing, _, closed := strings.Cut(after, "```")
	if !ok || !closed {
		t.Fatalf("README.md: no yaml block after %q", intro)
	}
	if listing != string(file) {
		t.Errorf("README.md's listing of %s differs from the file:\n%s", defaultConfig, lineDiff(listing, string(file)))
	}
}

// lineDiff names the first line where the README's text and the file's part.
func lineDiff(readme, file string) string {
	r, f := strings.Split(readme, "\n"), strings.Split(file, "\n")
	for i := 0; i < len(r) || i < len(f); i++ {
		var a, b string
		if i < len(r) {
			a = r[i]
		}
		if i < len(f) {
			b = f[i]
		}
		if a != b {
			return "line " + itoa(i+1) + ":\n  README: " + a + "\n  file:   " + b
		}
	}
	return "(only in the line endings)"
}
