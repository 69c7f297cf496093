// Greedy decoding with llama.cpp's CPU backend, printing the raw logits: the goldens of
// tools/make_gguf_fixtures.py. Built against the static libllama/libggml of
// tools/build_llamacpp.sh (the script compiles it).
//
//   llamacpp_logits MODEL.gguf N_PREDICT TOP_K IDS [IDS ...]     (IDS: comma-separated token ids)
//
// For each prompt, one JSON line: {"prompt": [...], "tokens": [...], "steps": [{"top": [[id,
// logit], ...], "gap": top1 - top2}, ...]}; step 0 is the logits after the whole prompt, step
// i those after the prompt and tokens[0..i). A fresh context per prompt; EOS is not special.
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

static void quiet(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.gguf N_PREDICT TOP_K IDS [IDS ...]\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    const int n_predict = atoi(argv[2]);
    const int top_k = atoi(argv[3]);

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    for (int a = 4; a < argc; a++) {
        std::vector<llama_token> prompt;
        for (const char * p = argv[a]; *p;) {
            prompt.push_back((llama_token) strtol(p, (char **) &p, 10));
            if (*p == ',') {
                p++;
            }
        }
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = prompt.size() + n_predict + 8;
        cp.n_batch = cp.n_ctx;
        cp.n_ubatch = cp.n_ctx;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        cp.no_perf = true;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            fprintf(stderr, "cannot create a context\n");
            return 1;
        }
        std::vector<llama_token> out;
        std::string steps;
        std::vector<llama_token> batch = prompt;
        for (int step = 0; step < n_predict; step++) {
            if (llama_decode(ctx, llama_batch_get_one(batch.data(), batch.size())) != 0) {
                fprintf(stderr, "llama_decode failed\n");
                return 1;
            }
            const float * logits = llama_get_logits_ith(ctx, -1);
            std::vector<int> idx(n_vocab);
            std::iota(idx.begin(), idx.end(), 0);
            std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(),
                              [&](int x, int y) { return logits[x] > logits[y] || (logits[x] == logits[y] && x < y); });
            char buf[64];
            steps += step ? ",{\"top\":[" : "{\"top\":[";
            for (int k = 0; k < top_k; k++) {
                snprintf(buf, sizeof buf, "%s[%d,%.9g]", k ? "," : "", idx[k], logits[idx[k]]);
                steps += buf;
            }
            snprintf(buf, sizeof buf, "],\"gap\":%.9g}", logits[idx[0]] - logits[idx[1]]);
            steps += buf;
            out.push_back(idx[0]);
            batch.assign(1, idx[0]);
        }
        std::string line = "{\"prompt\":[";
        for (size_t i = 0; i < prompt.size(); i++) {
            line += (i ? "," : "") + std::to_string(prompt[i]);
        }
        line += "],\"tokens\":[";
        for (size_t i = 0; i < out.size(); i++) {
            line += (i ? "," : "") + std::to_string(out[i]);
        }
        line += "],\"steps\":[" + steps + "]}";
        puts(line.c_str());
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}
