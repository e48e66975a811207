"""The network as a Hugging Face transformers model, for folders that load without aogpt.

configuration_aogpt.py and modeling_aogpt.py wrap ModelConfig and AOGPT in transformers' classes;
remote_code.py copies them, with the model modules they import, into an exported folder
(tools/export_hf.py), where `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`
finds them. Their `aogpt.` imports become relative there, so the folder needs only torch and
transformers.
"""
