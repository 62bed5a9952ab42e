#!/usr/bin/env bash
# Writes slicetrain(1) from the binary's own --help texts, so the man page never drifts from the
# flags: one section per subcommand, plus the environment and files the binary reads.
#   scripts/make_manpage.sh BUILD/slicetrain OUT.1
# CMake runs it after linking (target `manpage`); `cmake --install` puts the page in share/man/man1.
set -euo pipefail
bin="$1"
out="$2"
version="$("$bin" --version | awk '{print $2}')"
# roff: a leading '.' or "'" starts a request, and backslashes escape; quote both.
esc() { sed -e 's/\\/\\e/g' -e "s/^\([.']\)/\\\\\&\1/"; }
commands=$("$bin" --help | awk '/^Subcommands:/{on=1; next} on && NF {print $1}')
{
  echo ".TH SLICETRAIN 1 \"\" \"slicetrain $version\" \"User Commands\""
  echo ".SH NAME"
  echo "slicetrain \\- fully sharded fine-tuning of Gemma 4 language models over a slice of devices"
  echo ".SH SYNOPSIS"
  echo ".B slicetrain"
  echo ".I command"
  echo "[\\fIoptions\\fR]"
  echo ".SH DESCRIPTION"
  echo "slicetrain reserves a slice of devices (CPU workers on one machine, or hosts started by"
  echo "Kubernetes, Slurm, Ray or mpirun), starts one worker per device with a global rank, and runs"
  echo "FSDP fine-tuning, evaluation and collective checks over it."
  echo "Run without arguments, \\fBslicetrain finetune\\fR trains the bundled gemma4-tiny preset on"
  echo "the bundled instruction set with 2 local CPU workers."
  echo ".SH COMMANDS"
  for c in $commands; do
    echo ".SS $c"
    echo ".nf"
    "$bin" "$c" --help | esc
    echo ".fi"
  done
  cat <<'ROFF'
.SH ENVIRONMENT
.TP
.B SLICETRAIN_DATA_DIR
The bundled data directory (tokenizer/, tiny_instruct/). Default: data/ beside the binary, then
<prefix>/share/slicetrain/data, then the source tree the binary was built from.
.TP
.B OMP_NUM_THREADS
Compute threads per worker; \fB--threads\fR overrides it. Default: the CPUs this process may use
(affinity mask and cgroup CPU quota) divided among the host's workers.
.TP
.B STORAGE_PATH
Where runs and checkpoints go (default ./runs).
.TP
.B SLICETRAIN_DASHBOARD_TOKEN
The dashboard's access token. A dashboard bound beyond loopback always needs one; without this
variable a random token is generated and printed in the dashboard URL.
.TP
.B SLICETRAIN_SECRET
The job secret shared by every host of a multi-host job (rendezvous store and worker pairs).
.TP
.B HF_TOKEN, HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE
The Hugging Face hub client, as in huggingface_hub.
.SH FILES
.TP
.I <prefix>/share/slicetrain/data
The bundled tokenizer and instruction set.
.TP
.I <prefix>/share/slicetrain/deploy
Kubernetes manifests, the Slurm batch script, the container files and the Ray adapter
(pip install <prefix>/share/slicetrain/deploy).
.SH EXIT STATUS
0 on success; 2 for bad input (a flag, a file, a data set); 75 when a peer was lost or a
collective timed out (a restart may cure it); 1 otherwise, including a job that does not fit in
memory.
.SH SEE ALSO
The README and docs/ of the slicetrain sources, installed in <prefix>/share/doc/slicetrain.
ROFF
} > "$out.tmp"
mv "$out.tmp" "$out"
