package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docCommands returns every pipetrain command README.md and docs/*.md show:
// the lines of code blocks that start with "$ pipetrain", and the inline
// code spans that start with "pipetrain " followed by a subcommand, each with
// where it was found.
func docCommands(t *testing.T) map[string]string {
	t.Helper()
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	inline := regexp.MustCompile("`(pipetrain [a-z]+[^`]*)`")
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inBlock := false
		for i, line := range strings.Split(string(b), "\n") {
			where := filepath.Base(f) + ":" + strconv.Itoa(i+1)
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inBlock = !inBlock
				continue
			}
			if inBlock {
				if c, ok := strings.CutPrefix(strings.TrimSpace(line), "$ "); ok && strings.HasPrefix(c, "pipetrain ") {
					out[c] = where
				}
				continue
			}
			for _, m := range inline.FindAllStringSubmatch(line, -1) {
				out[m[1]] = where
			}
		}
	}
	return out
}

var placeholder = regexp.MustCompile(`^[A-Z][A-Z_]*$`)

// docArgs turns a command as documented into arguments: quotes are kept
// together, optional parts ("[--steps N]") are kept, and of alternatives
// ("all|NAME", "--config FILE | --resume RUN_DIR") the first is taken;
// placeholders become "1".
func docArgs(c string) []string {
	c = strings.NewReplacer("[", " ", "]", " ", `\|`, "|").Replace(c)
	if i := strings.Index(c, " | "); i >= 0 {
		c = c[:i]
	}
	var args []string
	var cur strings.Builder
	quote := rune(0)
	for _, r := range c {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote == 0 && (r == '"' || r == '\''):
			quote = r
		case quote == 0 && r == ' ':
			if cur.Len() > 0 {
				args = append(args, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		args = append(args, cur.String())
	}
	for i, a := range args {
		if alt, _, ok := strings.Cut(a, "|"); ok && !strings.HasPrefix(a, "-") {
			args[i] = alt
		}
		// A placeholder value (N, FILE, RUN_DIR): one that every flag type
		// here parses.
		if placeholder.MatchString(args[i]) {
			args[i] = "1"
		}
	}
	return args[1:] // without "pipetrain"
}

// TestDocumentedCommandsParse holds every command the README and docs show
// against the program: the subcommand must exist and take every flag given,
// so that docs and CLI cannot drift apart unnoticed.
func TestDocumentedCommandsParse(t *testing.T) {
	cmds := docCommands(t)
	if len(cmds) < 20 {
		t.Fatalf("found only %d documented commands; is the extraction broken?", len(cmds))
	}
	for c, where := range cmds {
		args := docArgs(c)
		root := newRoot()
		sub, rest, err := root.Find(args)
		if err != nil || sub == root {
			t.Errorf("%s: %q: no such command (%v)", where, c, err)
			continue
		}
		if err := sub.ParseFlags(rest); err != nil {
			t.Errorf("%s: %q: %v", where, c, err)
		}
	}
}
