#!/bin/sh
# Entry point of the orgmem image: runs `orgmem "$@"`, after two checks.
#
# - NAME_FILE: Docker and Kubernetes secrets arrive as files, but the gateway reads its root
#   keys (and a KEK passphrase) from the environment; for each NAME below, NAME_FILE names a
#   file whose content (without trailing newlines) becomes NAME.
# - Placeholders: a value starting with REPLACE_ME (as in deploy/k8s/secret.yaml) is refused,
#   so a template applied unedited cannot start a gateway with a known root key.
set -eu

for name in ORGMEM_ROOT_ACCESS_KEY ORGMEM_ROOT_SECRET_KEY ORGMEM_KEK_PASSPHRASE; do
    eval "file=\${${name}_FILE:-}"
    [ -n "$file" ] || continue
    eval "already=\${${name}:-}"
    if [ -n "$already" ]; then
        echo "docker-entrypoint: both $name and ${name}_FILE are set; set one" >&2
        exit 2
    fi
    if [ ! -r "$file" ]; then
        echo "docker-entrypoint: ${name}_FILE names $file, which this user (uid $(id -u)) cannot read" >&2
        exit 2
    fi
    value=$(cat "$file")
    export "$name=$value"
    unset "${name}_FILE"
done

for name in ORGMEM_ROOT_ACCESS_KEY ORGMEM_ROOT_SECRET_KEY AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY; do
    eval "value=\${${name}:-}"
    case "$value" in
        REPLACE_ME*)
            echo "docker-entrypoint: $name is still a placeholder (REPLACE_ME...); put the real value in the secret" >&2
            exit 2 ;;
    esac
done

exec orgmem "$@"
