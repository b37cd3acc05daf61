#!/usr/bin/env bash
# Installs what the pipetrain_cuda build tag needs on a Debian 12 (bookworm)
# build machine (docs/gpu.md): CUDA 11.8's nvcc (nvidia-cuda-toolkit), its
# headers (nvidia-cuda-dev: cuda.h) and the driver's user-space library to link
# -lcuda against (libcuda1). They live in Debian's non-free component, the
# driver's support packages in contrib; this adds both as a second sources
# entry beside the system's own (same archive, same keyring). About 800 MB to
# download, 5 minutes on a build machine here.
# Nothing here needs a GPU; the GPU machine brings its own driver and cuBLAS.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
PACKAGES="nvidia-cuda-toolkit nvidia-cuda-dev libcuda1"

missing=$(for p in $PACKAGES; do dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q ' installed$' || echo "$p"; done | tr '\n' ' ')
if [ -z "$missing" ]; then
	exit 0
fi
sources=/etc/apt/sources.list.d/debian-non-free.sources
if [ ! -e "$sources" ]; then
	$SUDO tee "$sources" >/dev/null <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
fi
echo "installing $missing"
$SUDO apt-get update -qq
# nvidia-cuda-toolkit recommends the driver's kernel parts and a GPU monitor;
# the build needs the compiler, the headers and the library to link against.
# shellcheck disable=SC2086 # a list of packages
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
