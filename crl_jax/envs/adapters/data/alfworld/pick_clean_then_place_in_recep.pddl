;; goal: put a clean mug in cabinet.
;; plan: go to diningtable 1 | take mug 1 from diningtable 1 | go to sinkbasin 1 | clean mug 1 with sinkbasin 1 | go to cabinet 1 | open cabinet 1 | move mug 1 to cabinet 1
;; Hand-written for crl_jax (ALFWorld task type pick_clean_then_place_in_recep) on the ALFRED domain.
(define (problem crl_pick_clean_then_place)
  (:domain alfred)
  (:objects
    agent1 - agent
    loc_bar_start loc_bar_table loc_bar_sink loc_bar_cabinet loc_bar_counter - location
    diningtable_bar_1 sinkbasin_bar_1 cabinet_bar_1 countertop_bar_1 - receptacle
    mug_bar_1 cup_bar_1 spoon_bar_1 - object
    MugType CupType SpoonType - otype
    DiningTableType SinkBasinType CabinetType CounterTopType - rtype
  )
  (:init
    (= (total-cost) 0)
    (atLocation agent1 loc_bar_start)
    (receptacleType diningtable_bar_1 DiningTableType)
    (receptacleType sinkbasin_bar_1 SinkBasinType)
    (receptacleType cabinet_bar_1 CabinetType)
    (receptacleType countertop_bar_1 CounterTopType)
    (receptacleAtLocation diningtable_bar_1 loc_bar_table)
    (receptacleAtLocation sinkbasin_bar_1 loc_bar_sink)
    (receptacleAtLocation cabinet_bar_1 loc_bar_cabinet)
    (receptacleAtLocation countertop_bar_1 loc_bar_counter)
    (openable cabinet_bar_1)
    (objectType mug_bar_1 MugType)
    (objectType cup_bar_1 CupType)
    (objectType spoon_bar_1 SpoonType)
    (pickupable mug_bar_1) (pickupable cup_bar_1) (pickupable spoon_bar_1)
    (cleanable mug_bar_1) (cleanable cup_bar_1) (cleanable spoon_bar_1)
    (inReceptacle mug_bar_1 diningtable_bar_1)
    (objectAtLocation mug_bar_1 loc_bar_table)
    (inReceptacle cup_bar_1 countertop_bar_1)
    (objectAtLocation cup_bar_1 loc_bar_counter)
    (inReceptacle spoon_bar_1 diningtable_bar_1)
    (objectAtLocation spoon_bar_1 loc_bar_table)
    (canContain CabinetType MugType) (canContain CabinetType CupType) (canContain CabinetType SpoonType)
    (canContain DiningTableType MugType) (canContain DiningTableType CupType) (canContain DiningTableType SpoonType)
    (canContain CounterTopType MugType) (canContain CounterTopType CupType) (canContain CounterTopType SpoonType)
    (canContain SinkBasinType MugType) (canContain SinkBasinType CupType) (canContain SinkBasinType SpoonType)
  )
  (:goal (exists (?o - object) (and (objectType ?o MugType) (isClean ?o) (inReceptacle ?o cabinet_bar_1))))
)
