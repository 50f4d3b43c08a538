# Sourced by build.sh and sanitizers.sh. st_configure DIR [cmake flags...]:
# configure DIR unless it is configured already. Warnings are errors under
# CI (CI=true) or with WERROR=1, and a DIR configured earlier without them
# (demo.sh leaves one) is switched over, so CI never reuses a lax cache.
st_configure() {
  local dir=$1 werror=OFF
  shift
  if [ "${CI:-}" = "true" ] || [ "${WERROR:-0}" = "1" ]; then werror=ON; fi
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S . -B "$dir" "$@" -DSHARDTRAIN_WERROR=$werror
  elif [ $werror = ON ] && ! grep -q '^SHARDTRAIN_WERROR:BOOL=ON' "$dir/CMakeCache.txt"; then
    echo "$(basename "$0"): $dir/ was configured without warnings-as-errors; reconfiguring it with them (CI=true or WERROR=1)"
    cmake -S . -B "$dir" -DSHARDTRAIN_WERROR=ON
  fi
}
