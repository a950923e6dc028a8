#!/bin/bash
#SBATCH -N 2
#DW jobdw type=scratch access_mode=striped capacity=10GiB pool=gpu
#DW stage_in type=directory source=/lustre/imagenet destination=$DW_JOB_STRIPED/imagenet
#DW persistentdw name=coco
srun python train.py
