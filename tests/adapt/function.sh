#!/bin/sh
# A function for `xfn adapt` tests, steered by the request's input.mode:
#   ok      one Normal result (and no meta: the adaptor copies the tag)
#   ttl     a result naming a nonce only this run knows, with meta.ttl 60s
#   garbage not JSON on stdout, a clue on stderr
#   crash   a message on stderr and exit code 3
#   sleep   sleeps a minute (for --timeout)
#   slow    sleeps two seconds, then answers as ok (for queueing and drain)
#   deep    a response whose results open 1 MiB of flow sequences
IN=$(cat)
case "$IN" in
*'"mode":"garbage"'*)
  echo "this is not JSON"
  echo "garbage-mode: wrote text instead of a response" >&2
  ;;
*'"mode":"crash"'*)
  echo "boom: cannot frobnicate the widget" >&2
  exit 3
  ;;
*'"mode":"deep"'*)
  printf '{"results":'
  head -c 1048576 /dev/zero | tr '\0' '['
  ;;
*'"mode":"sleep"'*)
  sleep 60
  ;;
*'"mode":"slow"'*)
  sleep 2
  echo '{"results":[{"severity":"SEVERITY_NORMAL","message":"hello from the container"}]}'
  ;;
*'"mode":"ttl"'*)
  NONCE=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf '{"meta":{"ttl":"60s"},"results":[{"severity":"SEVERITY_NORMAL","message":"run %s"}]}\n' "$NONCE"
  ;;
*)
  echo '{"results":[{"severity":"SEVERITY_NORMAL","message":"hello from the container"}]}'
  ;;
esac
