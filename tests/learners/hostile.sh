# A hostile learner (POSIX sh, so that any user can run it): it tries to reach what the platform
# trusts and prints one line per try, "tried NAME: got it" or "tried NAME: refused". Then it does
# what a learner may do (report progress, write a checkpoint, in its own directories) and exits 0.
# TARGET_DATA_DIR names the platform's data directory and TARGET_PLATFORM_PID the platform's process
# (a learner could guess both); LEARNER_PYTHON is a Python that has ffdl.learner.
# Writes open files for appending without writing anything, so a try that succeeds changes nothing.

try() {
    name=$1
    shift
    if "$@" >/dev/null 2>&1; then echo "tried $name: got it"; else echo "tried $name: refused"; fi
}
has() { env | grep -q "^$1="; }
data=$TARGET_DATA_DIR
platform=$TARGET_PLATFORM_PID
# the agent is whichever process runs the learner agent module, if the learner can see it at all
agent_environ() {
    for process in /proc/[0-9]*; do
        if grep -q 'ffdl[.]learner[.]agent' "$process/cmdline" 2>/dev/null; then cat "$process/environ" && return 0; fi
    done
    return 1
}

try "env FFDL_TOKEN" has FFDL_TOKEN
try "env FFDL_KAFKA__SASL_PASSWORD" has FFDL_KAFKA__SASL_PASSWORD
try "the agent's environment" agent_environ
try "the platform's environment" cat "/proc/$platform/environ"
try "read tenants.json" cat "$data/tenants.json"
try "write tenants.json" sh -c ": >> '$data/tenants.json'"
try "create a file in the data dir" sh -c ": > '$data/planted'"
try "write the log" sh -c ": >> '$data/log.sqlite'"
try "write the heartbeat keys" sh -c ": >> '$data/heartbeats.sqlite'"
try "forge a pidfile" sh -c ": > '$FFDL_CHECKPOINT_DIR/../run/attempt-9-rank-0.pid'"
try "write the agent's log of it" sh -c ": >> '$FFDL_LOG_FILE'"

echo "job env: ${FROM_MANIFEST:-missing}"
echo "wrapped env: $(env | grep -c '^FFDL_JOB_ENV_')"
echo "uid: $(id -u)"
echo weights > "$FFDL_CHECKPOINT_DIR/step-1" && echo "own checkpoint: written"
"$LEARNER_PYTHON" -c 'from ffdl import learner; learner.report_progress(1)' && echo "own report: written"
echo "done"
