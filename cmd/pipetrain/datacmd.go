package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/data"
)

// dataCmd groups the commands that work on data files.
func dataCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "data",
		Short: "Inspect data files, and tokenize text into token shards",
		Example: `  pipetrain data inspect fineweb_train_000001.bin   # format, dtype, tokens, token id range
  # pipetrain data tokenize: see its --help`,
	}
	c.AddCommand(inspectCmd(), tokenizeCmd())
	return c
}

func inspectCmd() *cobra.Command {
	var format, dtype string
	var arrays bool
	c := &cobra.Command{
		Use:   "inspect FILE...",
		Short: "Print each token file's format, dtype, token count, documents and token id range",
		Long: `Print, for each file, one line: its format (llm.c, nanogpt, megatron, npy),
the tokens' dtype, the header's version, how many tokens it holds, the
documents of a Megatron pair, and the smallest and largest token id (which
reads every token). A NumPy file that holds no token array prints its dtype
and shape. A file refused as dataset tokens would refuse it (bad magic, a
length unlike its header's) stops the command with that error.

With --array, each argument is an array as data.dataset arrays names one (a
.npy file, FILE.safetensors:TENSOR, or an IDX file such as Fashion-MNIST's):
its dtype and shape, and for a labels array (integers, one per example) how
many examples carry each label.`,
		Example: `  pipetrain data inspect data/fineweb_val_000000.bin data/fineweb_train_*.bin
  pipetrain data inspect --format nanogpt --dtype uint32 tokens.dat
  pipetrain data inspect corpus_text_document.idx    # a Megatron pair, by its .idx or .bin
  pipetrain data inspect --array /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, path := range args {
				do := func() error { return inspect(cmd.OutOrStdout(), path, format, dtype) }
				if arrays {
					do = func() error { return inspectArray(cmd.OutOrStdout(), path) }
				}
				if err := do(); err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.Flags().StringVar(&format, "format", "auto", "the files' format: "+strings.Join(data.TokenFormats, ", "))
	c.Flags().StringVar(&dtype, "dtype", "uint16", "the element type of nanoGPT's headerless files: "+strings.Join(data.NanoGPTDTypes, ", "))
	c.Flags().BoolVar(&arrays, "array", false, "read each argument as a feature or labels array (.npy, FILE.safetensors:TENSOR, IDX), as data.dataset arrays does")
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

// inspectArray prints an array's dtype and shape and, for labels (one
// integer an example), the examples of each label, reading every label.
func inspectArray(w io.Writer, spec string) error {
	a, err := data.OpenArray(spec)
	if err != nil {
		return err
	}
	defer a.Close()
	line := fmt.Sprintf("%s: %s, shape %v", a.Name, a.DType, a.Shape)
	if a.RowLen() == 1 && (a.DType == "uint8" || a.DType == "int32" || a.DType == "int64") {
		counts := map[int64]int{}
		for i := range a.Rows() {
			counts[a.Label(i)]++
		}
		labels := slices.Sorted(maps.Keys(counts))
		var parts []string
		for _, l := range labels {
			parts = append(parts, fmt.Sprintf("%d: %d", l, counts[l]))
		}
		line += fmt.Sprintf(", %d labels (%s)", len(labels), strings.Join(parts, ", "))
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

func tokenizeCmd() *cobra.Command {
	o := data.TokenizeOptions{ShardTokens: data.DefaultShardTokens}
	c := &cobra.Command{
		Use:   "tokenize --tokenizer byte|char|FILE.json --out DIR TEXT...",
		Short: "Tokenize text files into llm.c shards that dataset tokens reads",
		Long: `Read the text files (or folders of them) in order as one stream, encode it
with the tokenizer, and write llm.c shards into DIR: train_000000.bin, ...
and, from the last --val-fraction of the text, val_000000.bin, ... (uint16
tokens when the vocabulary fits 65536 ids, else uint32), each at most
--shard-tokens tokens, beside DIR/tokenizer.json, which records the
tokenizer for pipetrain sample. The tokenizer is byte (256 ids), char (the
bytes the text uses) or a Hugging Face tokenizer.json of a byte-level BPE
(GPT-2's and its like). A progress bar on stderr follows a long input.`,
		Example: `  pipetrain data tokenize --tokenizer byte --out tok input.txt
  pipetrain data tokenize --tokenizer gpt2/tokenizer.json --out fineweb --shard-tokens 100000000 docs/
  # then in the config: data: {dataset: tokens, train_shards: "tok/train_*.bin", val_shards: "tok/val_*.bin"}`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Tokenizer == "" || o.Out == "" {
				return fmt.Errorf("--tokenizer and --out are required")
			}
			o.Progress, o.Live, o.ProgressFrom = progressTo(cmd.ErrOrStderr())
			res, err := data.Tokenize(args, o)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, s := range append(res.Train, res.Val...) {
				fmt.Fprintf(w, "%s: %d tokens\n", s.Path, s.Tokens)
			}
			fmt.Fprintf(w, "%s: %s tokenizer, %d ids; %d bytes of text\n", res.Tokenizer, o.Tokenizer, res.Vocab, res.Bytes)
			return nil
		},
	}
	c.Flags().StringVar(&o.Tokenizer, "tokenizer", "", "byte, char, or the path of a Hugging Face tokenizer.json (byte-level BPE)")
	c.Flags().StringVar(&o.Out, "out", "", "the folder of the shards")
	c.Flags().Int64Var(&o.ShardTokens, "shard-tokens", data.DefaultShardTokens, "the most tokens one shard holds")
	c.Flags().Float64Var(&o.ValFraction, "val-fraction", 0.1, "the fraction of the text, from its end, for the validation shards (0: none)")
	c.Flags().BoolVar(&o.Force, "force", false, "replace the shards and tokenizer DIR holds already")
	return c
}

// progressTo is where tokenize draws its progress: redrawn in place on a
// terminal for an input of 4 MiB or more, as a line per tenth elsewhere
// (a log) for one of 1 GiB or more, so short runs and tests stay quiet.
func progressTo(w io.Writer) (io.Writer, bool, int64) {
	if f, ok := w.(*os.File); ok {
		if info, err := f.Stat(); err == nil && info.Mode()&os.ModeCharDevice != 0 {
			return w, true, 4 << 20
		}
	}
	return w, false, 1 << 30
}
