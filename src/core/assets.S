/* The CLIP vocabulary, linked into the binary so `sdtrain init` needs no data files beside it. */
    .section .rodata
    .balign 16
    .global sd_asset_vocab_json
sd_asset_vocab_json:
    .incbin "clip-vocab/vocab.json"
    .global sd_asset_vocab_json_end
sd_asset_vocab_json_end:
    .balign 16
    .global sd_asset_merges_txt
sd_asset_merges_txt:
    .incbin "clip-vocab/merges.txt"
    .global sd_asset_merges_txt_end
sd_asset_merges_txt_end:
    .section .note.GNU-stack,"",@progbits
