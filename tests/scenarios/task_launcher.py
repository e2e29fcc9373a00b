"""Starts NTASKS copies of a training script the way ``srun`` or ``mpirun`` does: each task gets
only its launcher's variables (Slurm: SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS; Open MPI:
OMPI_COMM_WORLD_RANK / _LOCAL_RANK / _SIZE; MPICH / Intel MPI: PMI_RANK / PMI_SIZE /
MPI_LOCALRANKID), never RANK. Usage: task_launcher.py slurm|openmpi|pmi NTASKS script [args];
exits with the first failing task's code, like srun."""
import os
import subprocess
import sys

VARIABLES = {
    "slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    "pmi": ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
}


def main() -> int:
    kind, ntasks, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    rank_var, local_var, size_var = VARIABLES[kind]
    tasks = []
    for task in range(ntasks):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        env.update({rank_var: str(task), local_var: str(task), size_var: str(ntasks)})
        tasks.append(subprocess.Popen([sys.executable, *command], env=env))
    codes = [task.wait() for task in tasks]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())
