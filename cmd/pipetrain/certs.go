package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/certs"
)

func certsCmd() *cobra.Command {
	var path, out string
	var days int
	var force bool
	c := &cobra.Command{
		Use:   "certs --config FILE --out DIR",
		Short: "Make a test CA and one TLS certificate per stage, for transport.tls",
		Example: `  # a test CA and one certificate per stage, for transport.tls
  pipetrain certs --config configs/fmnist-mlp-4stage.yaml --out certs/`,
		Long: `Make a test CA and one TLS certificate per stage, for transport.tls.

Writes DIR/ca.pem, DIR/ca-key.pem and DIR/stage-N.pem, DIR/stage-N-key.pem for
every stage in the config. Each certificate names its stage's hosts (every
replica's), the job's name "pipetrain-job" and the loopback names, and serves
to both listen and dial. A job whose addresses are auto, known only at run
time, checks that name instead of the host dialed. Prints the transport.tls
settings to add to the config. See docs/security.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if days < 1 {
				return fmt.Errorf("--days %d: certificates must be valid for at least 1 day", days)
			}
			// Unchecked: the config may already name the files about to be
			// written, or listen beyond loopback waiting for them.
			cfg, err := configs.LoadUnchecked(path)
			if err != nil {
				return err
			}
			addresses, err := stageAddresses(cfg)
			if err != nil {
				return err
			}
			files, err := certs.Write(out, addresses, time.Duration(days)*24*time.Hour, force)
			if errors.Is(err, certs.ErrExists) {
				return fmt.Errorf("%w (--force replaces them all)", err)
			}
			if err != nil {
				return err
			}
			printCertsDone(cmd.OutOrStdout(), cfg.Path, out, files, days)
			return nil
		},
	}
	c.Flags().StringVarP(&path, "config", "c", "", "run config whose stages get certificates")
	c.Flags().StringVar(&out, "out", "", "directory for the CA and the certificates (created if missing)")
	c.Flags().IntVar(&days, "days", 365, "validity of the CA and the certificates, in days")
	c.Flags().BoolVar(&force, "force", false, "overwrite existing files (a new CA invalidates the old certificates)")
	c.MarkFlagRequired("config")
	c.MarkFlagRequired("out")
	return c
}

// stageAddresses lists each stage's addresses (one per replica), checked as
// far as a certificate needs them, since the config was not validated.
func stageAddresses(cfg *configs.Config) ([][]string, error) {
	if len(cfg.Stages) == 0 {
		return nil, fmt.Errorf("%s: stages: no stages to make certificates for", cfg.Path)
	}
	var addresses [][]string
	for i, s := range cfg.Stages {
		field, list := "address", []string{s.Address}
		if len(s.Addresses) > 0 {
			field, list = "addresses", s.Addresses
		}
		if _, err := certs.StageHosts(list...); err != nil {
			return nil, fmt.Errorf("%s: stages[%d].%s: %v", cfg.Path, i, field, err)
		}
		addresses = append(addresses, list)
	}
	return addresses, nil
}

// printCertsDone says what was written and prints the settings to paste.
func printCertsDone(w io.Writer, configPath, out string, files certs.Files, days int) {
	dir := configRelative(configPath, out)
	fmt.Fprintf(w, "wrote %s, %s and the certificates and keys of stages 0-%d (valid %d days)\n",
		files.CA, files.CAKey, len(files.Stage)-1, days)
	fmt.Fprintf(w, "\nadd to %s (paths relative to its directory):\n\n", configPath)
	fmt.Fprintf(w, "transport:\n  tls:\n    ca: %s\n    cert: %s\n    key: %s\n\n",
		strconv.Quote(filepath.Join(dir, "ca.pem")),
		strconv.Quote(filepath.Join(dir, "stage-{stage}.pem")),
		strconv.Quote(filepath.Join(dir, "stage-{stage}-key.pem")))
	fmt.Fprintf(w, "Every stage's host needs these files except ca-key.pem, which only signs new\ncertificates: keep it off the stage hosts.\n")
}

// configRelative names dir as the config should: relative to the config's
// directory when it lies below it, else absolute.
func configRelative(configPath, dir string) string {
	absDir, err1 := filepath.Abs(dir)
	base, err2 := filepath.Abs(filepath.Dir(configPath))
	if err1 != nil || err2 != nil {
		return dir
	}
	rel, err := filepath.Rel(base, absDir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return absDir
	}
	return rel
}
