"""A FRESH vLLM engine started from a checkpoint directory: prints {fingerprint, tokens} as JSON
(the reference of the refit tests). Usage: fresh_engine.py DIR [TP]"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def main():
    directory, tp = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
    llm = harness.engine(directory, tp)
    fp = llm.collective_rpc("dcr_fingerprint")
    tokens = harness.greedy(llm)
    print("RESULT " + json.dumps({"fingerprint": fp, "tokens": tokens}), flush=True)
    os._exit(0)  # vLLM's teardown of a TP engine is slow; the answer is out


if __name__ == "__main__":
    main()
