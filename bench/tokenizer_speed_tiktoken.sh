#!/bin/bash
# Llama-family tokenizer speed (qwen.tiktoken with the qwen preset):
# bench/tokenizer_speed.sh --tokenizer qwen, which says what it measures.
#
#   bash bench/tokenizer_speed_tiktoken.sh [BUILD_DIR] [RUNS]    (default build, 3)
exec bash "$(dirname "$0")/tokenizer_speed.sh" --tokenizer qwen "$@"
