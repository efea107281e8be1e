# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_sandboxd_global_optspecs
    string join \n h/help V/version
end

function __fish_sandboxd_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_sandboxd_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_sandboxd_using_subcommand
    set -l cmd (__fish_sandboxd_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c sandboxd -n "__fish_sandboxd_needs_command" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -s V -l version -d 'Print version'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "serve" -d 'Run the daemon (serves the provisioner HTTP API)'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "bundle" -d 'Write the OCI bundle a create would use (for operators and reviewers)'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "kube" -d 'Kubernetes backend: render the objects of a create; the Pods\' init step; the one-time ownership migration'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "seccomp" -d 'Audit the seccomp profile, or run a command under it'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "image" -d 'Native sandbox images: pull, import, ls, rm, gc (the store under <state_dir>/images; safe to run while the daemon serves)'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "ls" -d 'List the sandboxes of the local daemon (id, status, generation, workdir, oom)'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "inspect" -d 'Show one sandbox of the local daemon as JSON'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "rm" -d 'Delete a sandbox through the local daemon'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "logs" -d 'Print the recent output (last 64 KiB, timestamped) of a sandbox\'s PID 1'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "doctor" -d 'Check this node for the configured backend and explain every problem with its fix; exit status 0 only when a create would work'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "config" -d 'Print the configuration file with every setting at its default (commented out): `sandboxd config default`'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "man" -d 'Write man pages (sandboxd.1 and one per subcommand) into a directory'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "openapi" -d 'Print the OpenAPI 3.1 description of the provisioner API (the one `GET /openapi.json` serves) or of the in-sandbox agent API'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "completions" -d 'Print a shell completion script (bash, zsh, fish, elvish, powershell)'
complete -c sandboxd -n "__fish_sandboxd_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand serve" -l config -d 'TOML config file (also SANDBOXD_CONFIG). Optional: every value has a default' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand serve" -l listen -d 'TCP listen address (also SANDBOXD_LISTEN); loopback unless the config allows otherwise' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand serve" -l unix-socket -d 'Also listen on this Unix socket (also SANDBOXD_UNIX_SOCKET)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand serve" -l backend -d 'Backend: native (default), kubernetes or memory (also PROVISIONER_BACKEND)' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand serve" -l state-dir -d 'State directory (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand serve" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -l sandbox-id -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -l uid -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -l thread-id -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -l workdir-path -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -l out -d 'Output directory (created; must not exist or be empty)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -l config -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -l image -d 'The create\'s `"image"` (default: the node\'s `[images] default`); taken from the image store, never pulled' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -l ephemeral -d 'Ephemeral sandbox (`inherit_env=false`, no workdir)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand bundle" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and not __fish_seen_subcommand_from render prepare migrate-ownership install-seccomp-profile help" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and not __fish_seen_subcommand_from render prepare migrate-ownership install-seccomp-profile help" -f -a "render" -d 'Print every object a create would submit, as YAML (offline)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and not __fish_seen_subcommand_from render prepare migrate-ownership install-seccomp-profile help" -f -a "prepare" -d 'The init step of sandbox Pods: install the agent, prepare user dirs'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and not __fish_seen_subcommand_from render prepare migrate-ownership install-seccomp-profile help" -f -a "migrate-ownership" -d 'One-time: give pre-existing user data to 1000:1000 (run as a Job)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and not __fish_seen_subcommand_from render prepare migrate-ownership install-seccomp-profile help" -f -a "install-seccomp-profile" -d 'Write the embedded seccomp profile as DIR/default.json for the kubelet (the node installer DaemonSet); with --every-seconds, keep it there'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and not __fish_seen_subcommand_from render prepare migrate-ownership install-seccomp-profile help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from render" -l sandbox-id -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from render" -l uid -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from render" -l thread-id -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from render" -l workdir-path -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from render" -l config -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from render" -l ephemeral -d 'Ephemeral sandbox (`inherit_env=false`, no workdir)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from render" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from prepare" -l agent-from -d 'The static agent to copy' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from prepare" -l agent-to -d 'Where to copy it (in the agent emptyDir)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from prepare" -l user-data -d 'Root of the user-data PVC' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from prepare" -l uid -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from prepare" -l workdir -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from prepare" -l skills -d 'Root of the skills PVC' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from prepare" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from migrate-ownership" -l root -d 'A volume root to migrate (the user-data PVC\'s mount point); repeat for more' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from migrate-ownership" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from install-seccomp-profile" -l dir -d 'The directory below the kubelet\'s seccomp root (`/var/lib/kubelet/seccomp/sandboxd` on the node)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from install-seccomp-profile" -l every-seconds -d 'Re-check (and rewrite when it differs) this often, forever' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from install-seccomp-profile" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from help" -f -a "render" -d 'Print every object a create would submit, as YAML (offline)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from help" -f -a "prepare" -d 'The init step of sandbox Pods: install the agent, prepare user dirs'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from help" -f -a "migrate-ownership" -d 'One-time: give pre-existing user data to 1000:1000 (run as a Job)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from help" -f -a "install-seccomp-profile" -d 'Write the embedded seccomp profile as DIR/default.json for the kubelet (the node installer DaemonSet); with --every-seconds, keep it there'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand kube; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and not __fish_seen_subcommand_from table diff check expect run help" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and not __fish_seen_subcommand_from table diff check expect run help" -f -a "table" -d 'Print every x86_64 syscall number and name with its action and rationale'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and not __fish_seen_subcommand_from table diff check expect run help" -f -a "diff" -d 'Compare with another profile in Docker format; non-zero exit if we allow anything it denies'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and not __fish_seen_subcommand_from table diff check expect run help" -f -a "check" -d 'Compile, count instructions, flag duplicates and clashes; non-zero on any problem'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and not __fish_seen_subcommand_from table diff check expect run help" -f -a "expect" -d 'Print `nr name errno` for every call whose result does not depend on its arguments and is an errno (the probe\'s input)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and not __fish_seen_subcommand_from table diff check expect run help" -f -a "run" -d 'Set no_new_privs, install the filters and exec CMD'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and not __fish_seen_subcommand_from table diff check expect run help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from table" -l profile -d 'Profile to read instead of the embedded default' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from table" -l denied -d 'Only the syscalls the profile deliberately denies (EPERM etc.)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from table" -l markdown -d 'Print a Markdown table'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from table" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from diff" -l against -d 'The other profile; default: Docker\'s default profile, embedded from seccomp/reference/docker-default.json (origin and version in seccomp/reference/README.md)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from diff" -l profile -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from diff" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from check" -l profile -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from check" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from expect" -l profile -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from expect" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from run" -l profile -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from run" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from help" -f -a "table" -d 'Print every x86_64 syscall number and name with its action and rationale'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from help" -f -a "diff" -d 'Compare with another profile in Docker format; non-zero exit if we allow anything it denies'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from help" -f -a "check" -d 'Compile, count instructions, flag duplicates and clashes; non-zero on any problem'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from help" -f -a "expect" -d 'Print `nr name errno` for every call whose result does not depend on its arguments and is an errno (the probe\'s input)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from help" -f -a "run" -d 'Set no_new_privs, install the filters and exec CMD'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand seccomp; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and not __fish_seen_subcommand_from pull import ls rm gc help" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and not __fish_seen_subcommand_from pull import ls rm gc help" -f -a "pull" -d 'Pull an image from its registry into the store (verified)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and not __fish_seen_subcommand_from pull import ls rm gc help" -f -a "import" -d 'Import an OCI image layout (directory or tar) or a `docker save` archive'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and not __fish_seen_subcommand_from pull import ls rm gc help" -f -a "ls" -d 'List the stored images: reference, digest, size'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and not __fish_seen_subcommand_from pull import ls rm gc help" -f -a "rm" -d 'Remove a reference (and its image when no other reference names it); refused while a sandbox uses the image'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and not __fish_seen_subcommand_from pull import ls rm gc help" -f -a "gc" -d 'Remove images no reference names and blobs no image needs (never an image a sandbox uses)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and not __fish_seen_subcommand_from pull import ls rm gc help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from pull" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from pull" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from pull" -l state-dir -d 'State directory holding the store (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from pull" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from import" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from import" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from import" -l state-dir -d 'State directory holding the store (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from import" -l tag -d 'The reference to store it under (default: the name the archive carries)' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from import" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from ls" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from ls" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from ls" -l state-dir -d 'State directory holding the store (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from ls" -l json -d 'One JSON object per line'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from ls" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from rm" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from rm" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from rm" -l state-dir -d 'State directory holding the store (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from rm" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from gc" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from gc" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from gc" -l state-dir -d 'State directory holding the store (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from gc" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from help" -f -a "pull" -d 'Pull an image from its registry into the store (verified)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from help" -f -a "import" -d 'Import an OCI image layout (directory or tar) or a `docker save` archive'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from help" -f -a "ls" -d 'List the stored images: reference, digest, size'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from help" -f -a "rm" -d 'Remove a reference (and its image when no other reference names it); refused while a sandbox uses the image'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from help" -f -a "gc" -d 'Remove images no reference names and blobs no image needs (never an image a sandbox uses)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand image; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand ls" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists): where it listens, its token' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand ls" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists); our own environment wins over it' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand ls" -l url -d 'API address: `http://HOST:PORT` or `unix:/path/to/api.sock` (default: the configured unix_socket, else the configured listen address)' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand ls" -l state-dir -d 'State directory holding the daemon\'s generated token (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand ls" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand inspect" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists): where it listens, its token' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand inspect" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists); our own environment wins over it' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand inspect" -l url -d 'API address: `http://HOST:PORT` or `unix:/path/to/api.sock` (default: the configured unix_socket, else the configured listen address)' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand inspect" -l state-dir -d 'State directory holding the daemon\'s generated token (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand inspect" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand rm" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists): where it listens, its token' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand rm" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists); our own environment wins over it' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand rm" -l url -d 'API address: `http://HOST:PORT` or `unix:/path/to/api.sock` (default: the configured unix_socket, else the configured listen address)' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand rm" -l state-dir -d 'State directory holding the daemon\'s generated token (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand rm" -l expected-generation -d 'Delete only if the sandbox is still this generation (else exit 1)' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand rm" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand logs" -l config -d 'Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists): where it listens, its token' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand logs" -l env-file -d 'The daemon\'s env file (default /etc/sandboxd/sandboxd.env when it exists); our own environment wins over it' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand logs" -l url -d 'API address: `http://HOST:PORT` or `unix:/path/to/api.sock` (default: the configured unix_socket, else the configured listen address)' -r
complete -c sandboxd -n "__fish_sandboxd_using_subcommand logs" -l state-dir -d 'State directory holding the daemon\'s generated token (also SANDBOXD_STATE_DIR)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand logs" -s f -l follow -d 'Keep printing new lines (once a second) until the sandbox is gone'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand logs" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand doctor" -l config -d 'The daemon\'s config file (also SANDBOXD_CONFIG)' -r -F
complete -c sandboxd -n "__fish_sandboxd_using_subcommand doctor" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand config; and not __fish_seen_subcommand_from default help" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand config; and not __fish_seen_subcommand_from default help" -f -a "default" -d 'The configuration file with every setting at its default, commented out (the Debian package\'s /etc/sandboxd/config.toml)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand config; and not __fish_seen_subcommand_from default help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand config; and __fish_seen_subcommand_from default" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "default" -d 'The configuration file with every setting at its default, commented out (the Debian package\'s /etc/sandboxd/config.toml)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand config; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand man" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand openapi" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand completions" -s h -l help -d 'Print help'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "serve" -d 'Run the daemon (serves the provisioner HTTP API)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "bundle" -d 'Write the OCI bundle a create would use (for operators and reviewers)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "kube" -d 'Kubernetes backend: render the objects of a create; the Pods\' init step; the one-time ownership migration'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "seccomp" -d 'Audit the seccomp profile, or run a command under it'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "image" -d 'Native sandbox images: pull, import, ls, rm, gc (the store under <state_dir>/images; safe to run while the daemon serves)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "ls" -d 'List the sandboxes of the local daemon (id, status, generation, workdir, oom)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "inspect" -d 'Show one sandbox of the local daemon as JSON'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "rm" -d 'Delete a sandbox through the local daemon'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "logs" -d 'Print the recent output (last 64 KiB, timestamped) of a sandbox\'s PID 1'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "doctor" -d 'Check this node for the configured backend and explain every problem with its fix; exit status 0 only when a create would work'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "config" -d 'Print the configuration file with every setting at its default (commented out): `sandboxd config default`'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "man" -d 'Write man pages (sandboxd.1 and one per subcommand) into a directory'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "openapi" -d 'Print the OpenAPI 3.1 description of the provisioner API (the one `GET /openapi.json` serves) or of the in-sandbox agent API'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "completions" -d 'Print a shell completion script (bash, zsh, fish, elvish, powershell)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and not __fish_seen_subcommand_from serve bundle kube seccomp image ls inspect rm logs doctor config man openapi completions help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from kube" -f -a "render" -d 'Print every object a create would submit, as YAML (offline)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from kube" -f -a "prepare" -d 'The init step of sandbox Pods: install the agent, prepare user dirs'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from kube" -f -a "migrate-ownership" -d 'One-time: give pre-existing user data to 1000:1000 (run as a Job)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from kube" -f -a "install-seccomp-profile" -d 'Write the embedded seccomp profile as DIR/default.json for the kubelet (the node installer DaemonSet); with --every-seconds, keep it there'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from seccomp" -f -a "table" -d 'Print every x86_64 syscall number and name with its action and rationale'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from seccomp" -f -a "diff" -d 'Compare with another profile in Docker format; non-zero exit if we allow anything it denies'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from seccomp" -f -a "check" -d 'Compile, count instructions, flag duplicates and clashes; non-zero on any problem'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from seccomp" -f -a "expect" -d 'Print `nr name errno` for every call whose result does not depend on its arguments and is an errno (the probe\'s input)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from seccomp" -f -a "run" -d 'Set no_new_privs, install the filters and exec CMD'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from image" -f -a "pull" -d 'Pull an image from its registry into the store (verified)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from image" -f -a "import" -d 'Import an OCI image layout (directory or tar) or a `docker save` archive'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from image" -f -a "ls" -d 'List the stored images: reference, digest, size'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from image" -f -a "rm" -d 'Remove a reference (and its image when no other reference names it); refused while a sandbox uses the image'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from image" -f -a "gc" -d 'Remove images no reference names and blobs no image needs (never an image a sandbox uses)'
complete -c sandboxd -n "__fish_sandboxd_using_subcommand help; and __fish_seen_subcommand_from config" -f -a "default" -d 'The configuration file with every setting at its default, commented out (the Debian package\'s /etc/sandboxd/config.toml)'
