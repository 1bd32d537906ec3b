# nix-sandbox-mcp session agent for bash: runs each request's code in this one
# shell, so variables, functions and the working directory persist.
# Protocol (docs/sessions.md): requests on descriptor $1 ("<id> <bytes>\n"
# then the code), one JSON reply line per request on $2
# ({"id": N, "status": S}), nothing on stdout/stderr but the code's output.



# Keep the protocol on descriptors scripts leave alone, 203 and 204. The
# descriptors given may be any, 203 or 204 among them (either way round):
# through fresh ones, so that closing those given closes no new one.
if [ "$1" != 203 ] || [ "$2" != 204 ]; then
  exec {__nsm_in}<&"$1" {__nsm_out}>&"$2"
  eval "exec $1<&- $2>&-"
  exec 203<&"$__nsm_in" 204>&"$__nsm_out" {__nsm_in}<&- {__nsm_out}>&-
  unset __nsm_in __nsm_out
fi

# `exit` in the code ends this shell: report the call's status and replace
# the shell with a fresh agent in the same sandbox (files and the working
# directory stay; variables and functions are gone).
__nsm_ended() {
  __nsm_status=$?
  if [ -n "$__nsm_id" ]; then
    printf '{"id":%s,"status":%s,"exited":true}\n' "$__nsm_id" "$__nsm_status" >&204
    exec bash "$BASH_SOURCE" 203 204
  fi
}
trap __nsm_ended EXIT

__nsm_id=
printf '{"ready":true}\n' >&204
while IFS=' ' read -r __nsm_id __nsm_size <&203; do
  __nsm_code=
  [ "$__nsm_size" -gt 0 ] && LC_ALL=C IFS= read -r -d '' -N "$__nsm_size" __nsm_code <&203
  eval "$__nsm_code"
  __nsm_status=$?
  printf '{"id":%s,"status":%s}\n' "$__nsm_id" "$__nsm_status" >&204
  __nsm_id=
done
trap - EXIT
