import cProfile, pstats, sys, time, os, torch
from atom_frontends.native.demo import build_checkpoint
from atom_frontends.native import LLM, SamplingParams
p = "/tmp/hp/ck"
if not os.path.exists(p + "/config.json"):
    build_checkpoint(p, "Qwen3ForCausalLM", seed=0, tokenizer=False, vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                     num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                     max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6)
llm = LLM(p, dtype="bfloat16", max_model_len=2048, max_num_seqs=32, enable_prefix_caching=False)
g = torch.Generator().manual_seed(0)
prompts = torch.randint(3, 1000, (32, 128), generator=g).tolist()
for temp in (0.0, 1.0):
    params = SamplingParams(temperature=temp, max_tokens=128, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    pr = cProfile.Profile()
    torch.cuda.synchronize(); t = time.perf_counter(); pr.enable()
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize(); pr.disable(); print("temperature", temp, "wall ms/step", (time.perf_counter() - t) * 1e3 / 128)
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25); st.sort_stats("cumulative").print_stats(40)
