# One image for every firsthop service; the subcommand picks the service:
#   docker run IMAGE relay | transceiver | signaling | agent --kind echo | ...
#
# No `# syntax=` line: that makes BuildKit fetch a frontend image from Docker Hub first, so
# every build fails where the Hub cannot be reached (air-gapped sites); nothing here needs a
# newer frontend than the engine's own. `--build-arg PYTHON_IMAGE=` takes a local base.
#
# Native code: every compiled dependency is a manylinux wheel that bundles the libraries it
# links (av carries FFmpeg, libopus and libvpx in av.libs/; pylibsrtp links libsrtp
# statically; cryptography and google-crc32c likewise). What is left to the system is glibc,
# libstdc++, libgcc_s and zlib, all already in python:3.11-slim, so neither stage installs an
# apt package (--only-binary makes a missing wheel a build error instead of a silent source
# build). What is compiled here is firsthop's own (setup.py): the relay's C data path
# (services/relay/_fastpath.c), two per-frame loops of the media path (shared/_speedups.c) and
# RNNoise for noise suppression (services/transceiver/media/rnnoise/, vendored), which link
# only libc and libm; so the builder is the full python image of the same Python (it has gcc
# and the headers) and the runtime the slim one.
# `--build-arg BUILDER_IMAGE=` and `PYTHON_IMAGE=` take local bases (the same Python in both:
# the venv is copied from one to the other).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG BUILDER_IMAGE=python:3.11-bookworm
# Optional extras baked in: `assistant` (the offline voice assistant's models, ~400 MB) and
# `noise` (RNNoise for the transceiver's noise suppression, ~90 MB);
# `--build-arg FIRSTHOP_EXTRAS=` builds the edge alone. (One default here; each stage that
# reads it names it again, as a stage sees only the ARGs it declares.)
ARG FIRSTHOP_EXTRAS=assistant,noise

# Three stages: `deps` (the venv with every dependency, read from pyproject.toml alone),
# `builder` (firsthop itself built and installed on it) and the runtime. The runtime takes the
# venv from `deps` and only firsthop's own files from `builder`, so a code change rebuilds and
# copies a few MB, not the ~1 GB venv again (a rebuild after a one-line change: 12 s instead of
# 25-28 s, and no new 1 GB layer; measured on the compose test's engine and local bases).
FROM ${BUILDER_IMAGE} AS deps
ARG FIRSTHOP_EXTRAS
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/firsthop
WORKDIR /src
# Dependencies first, read from pyproject.toml alone, so a code change reuses this layer; each
# at the version in constraints.txt, the one the tests ran (`make lock` writes it), so two
# builds of one commit install the same packages whatever PyPI holds that day.
COPY pyproject.toml README.md constraints.txt ./
RUN python -c 'import os, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; extras = os.environ["FIRSTHOP_EXTRAS"].split(",") if os.environ["FIRSTHOP_EXTRAS"] else []; print("\n".join(p["dependencies"] + [r for e in extras for r in p["optional-dependencies"][e]]))' > /tmp/requirements.txt \
 && /opt/firsthop/bin/pip install --only-binary=:all: -c constraints.txt -r /tmp/requirements.txt

FROM deps AS builder
ARG FIRSTHOP_EXTRAS
COPY shared ./shared
COPY services ./services
# src/firsthop/ names the two folders as one package (symlinks: the wheel holds the files).
COPY src ./src
COPY setup.py ./
# -P keeps /src off sys.path, so this imports the installed package (with its demo page, the
# C data path and, with the `noise` extra, RNNoise built and its model loaded: a builder
# without a compiler fails here, not a relay or a call later).
RUN /opt/firsthop/bin/pip install --no-deps . \
 && /opt/firsthop/bin/python -P -c 'import firsthop.services.signaling.app' \
 && /opt/firsthop/bin/python -P -c 'import firsthop.services.relay._fastpath' \
 && /opt/firsthop/bin/python -P -c 'import firsthop.shared._speedups' \
 && case ",${FIRSTHOP_EXTRAS}," in *,noise,*) /opt/firsthop/bin/python -P -c \
      'from firsthop.services.transceiver.media.denoise import Denoiser; Denoiser().close()';; esac \
 && /opt/firsthop/bin/firsthop --help >/dev/null
# What the install added to the venv of `deps` (firsthop's package, its dist-info and its
# `firsthop` script), staged at the same paths for the runtime to lay over that venv.
RUN site=$(/opt/firsthop/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && mkdir -p "/stage$site" /stage/opt/firsthop/bin \
 && cp -a "$site/firsthop" "$site"/firsthop-*.dist-info "/stage$site/" \
 && cp -a /opt/firsthop/bin/firsthop /stage/opt/firsthop/bin/

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="firsthop" \
      org.opencontainers.image.description="WebRTC edge for real-time voice AI" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid so Kubernetes' runAsNonRoot can check it without a passwd lookup.
RUN groupadd --system --gid 10001 firsthop \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin firsthop
# Same path as in the builder, so the venv's scripts keep working: the dependencies first (a
# layer that changes only with pyproject.toml's dependencies), then firsthop itself over them.
COPY --from=deps /opt/firsthop /opt/firsthop
COPY --from=builder /stage/ /
ENV PATH=/opt/firsthop/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /tmp
USER 10001:10001
# relay: 3478/udp public, 3479/udp internal, 9478 metrics; transceiver: 5004/udp media,
# 8081 internal API; signaling: 8080; agent: 8090.
EXPOSE 3478/udp 3478/tcp 3479/udp 9478 5004/udp 8081 8080 8090
ENTRYPOINT ["firsthop"]
CMD ["--help"]
