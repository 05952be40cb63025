# Sourced by run.sh and train.sh (with ROOT set): the host compiler, through ccache when present
# (keyed by content; paths relative to the tree, so clones share entries).
CXX=(g++)
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
  CXX=(ccache g++)
fi
