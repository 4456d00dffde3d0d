# bash completion for psnet's daemons (pscoord, psd, workerd, psgate),
# installed under each one's name: their long options, read from the
# program's own --help (so they never fall behind it); a word that is no
# option completes as a file name. psctl's comes from `psctl completion bash`.
_psnet_daemon() {
        local cur=${COMP_WORDS[COMP_CWORD]}
        COMPREPLY=()
        [[ $cur == -* ]] || return
        local opts
        opts=$("${COMP_WORDS[0]}" --help 2>/dev/null | sed -n 's/^  \(--[a-z0-9-]*\).*/\1/p')
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o default -F _psnet_daemon pscoord psd workerd psgate
