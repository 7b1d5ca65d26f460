#!/usr/bin/env bash
# Makes what a secured mutwo deployment needs (docs/deploy.md,
# "Authentication and TLS"), into DIR (default deploy/secrets, git-ignored):
#
#   tokens.txt            mutwo-server --auth_tokens_file: one line per
#                         principal, "ROLE PRINCIPAL sha256:HEX" (hashes only)
#   admin.token client.token worker.token
#                         the tokens themselves (32 random bytes, base64url),
#                         for `mutwo --token_file`, MUTWO_TOKEN_FILE, ...
#   ca.crt ca.key         a private CA (keep ca.key offline)
#   tls.crt tls.key       the server's certificate, signed by the CA, for
#                         localhost, 127.0.0.1, the compose service `server`
#                         and the Kubernetes Service `mutwo-server` (plus any
#                         NAME given after DIR)
#
# Usage: deploy/gen-auth.sh [DIR [NAME...]]
# Refuses to overwrite an existing DIR/tokens.txt. Needs openssl and
# sha256sum. DIR is created mode 0700; the files in it are 0644 so that the
# containers (uid 1000) can read them through bind mounts: keep DIR private.
set -euo pipefail
dir=${1:-"$(dirname "$0")/secrets"}
shift || true
if [ -e "$dir/tokens.txt" ]; then
  echo "gen-auth: $dir/tokens.txt exists; remove $dir first to make new ones" >&2
  exit 1
fi
mkdir -p "$dir"
chmod 0700 "$dir"
umask 022

names=(localhost server mutwo-server mutwo-server.mutwo mutwo-server.mutwo.svc
       mutwo-server.mutwo.svc.cluster.local "$@")
san="IP:127.0.0.1"
for n in "${names[@]}"; do san="$san,DNS:$n"; done

ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$dir/ca.key" -out "$dir/ca.crt" \
  -days 3650 -subj "/CN=mutwo CA" 2>/dev/null
openssl req "${ec[@]}" -keyout "$dir/tls.key" -out "$dir/tls.csr" \
  -subj "/CN=mutwo-server" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" > "$dir/tls.ext"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -CAcreateserial -out "$dir/tls.crt" -days 825 -extfile "$dir/tls.ext" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/tls.ext" "$dir/ca.srl"

{
  echo "# mutwo-server --auth_tokens_file: ROLE PRINCIPAL sha256:HEX"
  echo "# (made by deploy/gen-auth.sh; add lines for more principals)"
} > "$dir/tokens.txt"
for role in admin client worker; do
  token=$(openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n')
  printf '%s\n' "$token" > "$dir/$role.token"
  hash=$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)
  echo "$role $role sha256:$hash" >> "$dir/tokens.txt"
done
chmod 0644 "$dir"/*
chmod 0600 "$dir/ca.key"  # no container needs it
echo "gen-auth: wrote $dir (tokens.txt, {admin,client,worker}.token, ca.crt, tls.crt, tls.key, ca.key)" >&2
