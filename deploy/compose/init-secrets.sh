#!/bin/sh
# Makes the secrets docker-compose.yml mounts, in ./secrets (kept private, made once):
#
#   orgmem-keyring.json   the KEK keyring (created by the gateway image itself)
#   root-access-key       the gateways' root keys (all replicas must share them)
#   root-secret-key
#   s3-credentials        the S3 service's keys, as an AWS credentials file for the gateways
#   seaweedfs-s3.json     the same keys as SeaweedFS's identity configuration
#
# Compose mounts file secrets as they are on the host, so the files the gateway (uid 10001)
# reads are given to uid 10001 with mode 0600 here. Back the keyring up apart from the
# bucket: without it nothing in the bucket can be read (`sudo cp secrets/orgmem-keyring.json ...`).
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 0700 secrets

rand() { head -c 96 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c "$1"; }

if [ ! -f secrets/root-access-key ]; then
    printf 'AKORGMEM%s\n' "$(rand 12 | tr 'a-z' 'A-Z')" >secrets/root-access-key
    rand 40 >secrets/root-secret-key
    echo "made root keys: secrets/root-access-key, secrets/root-secret-key"
fi
if [ ! -f secrets/s3-credentials ]; then
    ak="AKS3$(rand 16 | tr 'a-z' 'A-Z')"
    sk=$(rand 40)
    printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$ak" "$sk" >secrets/s3-credentials
    printf '{"identities": [{"name": "orgmem", "credentials": [{"accessKey": "%s", "secretKey": "%s"}], "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}\n' \
        "$ak" "$sk" >secrets/seaweedfs-s3.json
    echo "made the S3 service's keys: secrets/s3-credentials, secrets/seaweedfs-s3.json"
fi

docker compose build gateway
as_root() { docker compose run --rm --no-deps --user 0 -v "$PWD/secrets:/out" --entrypoint "$1" gateway -c "$2"; }
if [ ! -f secrets/orgmem-keyring.json ]; then
    as_root python 'from pathlib import Path; from vault.keys import create_keyring; create_keyring(Path("/out/orgmem-keyring.json"))'
    echo "made the KEK keyring: secrets/orgmem-keyring.json (back it up apart from the bucket)"
fi
as_root sh 'cd /out && chown 10001:10001 orgmem-keyring.json root-access-key root-secret-key s3-credentials && chmod 0600 *'
