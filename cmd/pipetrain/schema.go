package main

import (
	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
)

func schemaCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "schema",
		Short: "Print the JSON Schema of config files, for editors' completion and checks",
		Long: `Print the JSON Schema (draft 2020-12) of pipetrain configs: every key with its
type, description, default and allowed values, made from the definitions that
loading and validation use. configs/pipetrain.schema.json holds it, and the
example configs name it in their first line, which yaml-language-server (VS
Code's YAML extension and other editors) reads:

  # yaml-language-server: $schema=./pipetrain.schema.json

The schema checks what an editor can check as you type; pipetrain validate
checks the rest (layers covering the model, addresses, files).`,
		Example: `  pipetrain schema > configs/pipetrain.schema.json       # regenerate the committed schema
  pipetrain schema > experiments/pipetrain.schema.json   # beside configs kept elsewhere`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := configs.Schema()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
}
