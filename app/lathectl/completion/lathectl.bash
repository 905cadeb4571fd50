# bash completion for lathectl: commands, flags, run ids, model names and host names.
#
#   source build/share/bash-completion/completions/lathectl     # from a build tree
#   installed: <prefix>/share/bash-completion/completions/lathectl (bash-completion loads it)
#
# The candidates come from `lathectl __complete WORDS...` (the words after the program name,
# the last being the one under the cursor, "" for a new word): run ids, model names and host
# names are read from the workspace named by --db, else $LATHE_DB, else the default one.

_lathectl() {
    local prog=${COMP_WORDS[0]}
    [[ $prog == "~/"* ]] && prog=$HOME/${prog#"~/"}
    local cur=${COMP_WORDS[COMP_CWORD]}
    local -a words=("${COMP_WORDS[@]:1:COMP_CWORD-1}" "$cur")
    local IFS=$'\n'
    COMPREPLY=($("$prog" __complete "${words[@]}" 2>/dev/null))
}

# With no candidates (a config file, --db PATH, --file MODEL.pt), complete file names.
complete -o bashdefault -o default -F _lathectl lathectl
