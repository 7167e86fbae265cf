"""The defrag job progress endpoint the job page polls (staff who may view defrag jobs)."""
from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.shortcuts import get_object_or_404

from capacity.defrag.models import DefragJob
from capacity.selectors import defrag_job_progress


def _may_view_jobs(user) -> bool:
    # The admin lets a user who may change a job also view it: the same rule here.
    return user.has_perm("capacity.view_defragjob") or user.has_perm("capacity.change_defragjob")


@staff_member_required
def job_progress(request, pk: int):
    if not _may_view_jobs(request.user):
        raise PermissionDenied("viewing defrag jobs needs the capacity.view_defragjob permission")
    job = get_object_or_404(DefragJob.objects.select_related("cluster"), pk=pk)
    return JsonResponse(defrag_job_progress(job=job))
