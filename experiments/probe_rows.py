"""What the probes here print and save: each result row as a JSON line as it comes, then all of them in one
file with the device and the number of programs."""
import json


def show(row: dict) -> dict:
    print(json.dumps(row), flush=True)
    return row


def save(path: str | None, programs: int, rows: list[dict]) -> None:
    if path:
        import torch
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "programs": programs, "rows": rows}, f, indent=1)
