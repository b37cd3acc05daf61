package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/data"
)

// dataCmd groups the commands that work on data files.
func dataCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "data",
		Short:   "Inspect data files",
		Example: `  pipetrain data inspect fineweb_train_000001.bin   # format, dtype, tokens, token id range`,
	}
	c.AddCommand(inspectCmd())
	return c
}

func inspectCmd() *cobra.Command {
	var format, dtype string
	c := &cobra.Command{
		Use:   "inspect FILE...",
		Short: "Print each token file's format, dtype, token count, documents and token id range",
		Long: `Print, for each file, one line: its format (llm.c, nanogpt, megatron, npy),
the tokens' dtype, the header's version, how many tokens it holds, the
documents of a Megatron pair, and the smallest and largest token id (which
reads every token). A NumPy file that holds no token array prints its dtype
and shape. A file refused as dataset tokens would refuse it (bad magic, a
length unlike its header's) stops the command with that error.`,
		Example: `  pipetrain data inspect data/fineweb_val_000000.bin data/fineweb_train_*.bin
  pipetrain data inspect --format nanogpt --dtype uint32 tokens.dat
  pipetrain data inspect corpus_text_document.idx    # a Megatron pair, by its .idx or .bin`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, path := range args {
				if err := inspect(cmd.OutOrStdout(), path, format, dtype); err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.Flags().StringVar(&format, "format", "auto", "the files' format: "+strings.Join(data.TokenFormats, ", "))
	c.Flags().StringVar(&dtype, "dtype", "uint16", "the element type of nanoGPT's headerless files: "+strings.Join(data.NanoGPTDTypes, ", "))
	return c
}

// inspect prints what path holds.
func inspect(w io.Writer, path, format, dtype string) error {
	if filepath.Ext(path) == ".npy" && (format == "auto" || format == data.FormatNPY) {
		h, err := npyHeader(path)
		if err != nil {
			return err
		}
		if len(h.Shape) != 1 || len(h.Descr) < 2 || !strings.ContainsAny(h.Descr[1:2], "iu") {
			fmt.Fprintf(w, "%s: npy, dtype %s, shape %v\n", path, h.Descr, h.Shape)
			return nil
		}
	}
	f, err := data.OpenTokenFile(path, format, dtype)
	if err != nil {
		return err
	}
	defer f.Close()
	what := f.Format
	if f.Version != 0 {
		what += fmt.Sprintf(" version %d", f.Version)
	}
	line := fmt.Sprintf("%s: %s, %s, %d tokens", f.Path, what, f.DType, f.Tokens)
	if f.Documents >= 0 {
		line += fmt.Sprintf(", %d documents in %d sequences", f.Documents, f.Sequences)
	}
	if f.Tokens > 0 {
		lo, hi := f.MinMax()
		line += fmt.Sprintf(", token ids %d to %d", lo, hi)
	}
	fmt.Fprintln(w, line)
	return nil
}

// npyHeader reads the header of the NumPy file at path.
func npyHeader(path string) (*data.NPYHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 1<<16)
	n, _ := io.ReadFull(f, b)
	h, err := data.ParseNPYHeader(b[:n])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}
