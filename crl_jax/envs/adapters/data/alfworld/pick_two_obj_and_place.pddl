;; goal: put two soapbar in cabinet.
;; plan: go to countertop 1 | take soapbar 1 from countertop 1 | go to cabinet 1 | open cabinet 1 | move soapbar 1 to cabinet 1 | go to bathtubbasin 1 | take soapbar 2 from bathtubbasin 1 | go to cabinet 1 | move soapbar 2 to cabinet 1
;; Hand-written for crl_jax (ALFWorld task type pick_two_obj_and_place) on the ALFRED domain.
(define (problem crl_pick_two_obj_and_place)
  (:domain alfred)
  (:objects
    agent1 - agent
    loc_bar_start loc_bar_counter loc_bar_tub loc_bar_cabinet loc_bar_toilet - location
    countertop_bar_1 bathtubbasin_bar_1 cabinet_bar_1 toilet_bar_1 - receptacle
    soapbar_bar_1 soapbar_bar_2 toiletpaper_bar_1 - object
    SoapBarType ToiletPaperType - otype
    CounterTopType BathtubBasinType CabinetType ToiletType - rtype
  )
  (:init
    (= (total-cost) 0)
    (atLocation agent1 loc_bar_start)
    (receptacleType countertop_bar_1 CounterTopType)
    (receptacleType bathtubbasin_bar_1 BathtubBasinType)
    (receptacleType cabinet_bar_1 CabinetType)
    (receptacleType toilet_bar_1 ToiletType)
    (receptacleAtLocation countertop_bar_1 loc_bar_counter)
    (receptacleAtLocation bathtubbasin_bar_1 loc_bar_tub)
    (receptacleAtLocation cabinet_bar_1 loc_bar_cabinet)
    (receptacleAtLocation toilet_bar_1 loc_bar_toilet)
    (openable cabinet_bar_1)
    (objectType soapbar_bar_1 SoapBarType)
    (objectType soapbar_bar_2 SoapBarType)
    (objectType toiletpaper_bar_1 ToiletPaperType)
    (pickupable soapbar_bar_1) (pickupable soapbar_bar_2) (pickupable toiletpaper_bar_1)
    (inReceptacle soapbar_bar_1 countertop_bar_1)
    (objectAtLocation soapbar_bar_1 loc_bar_counter)
    (inReceptacle soapbar_bar_2 bathtubbasin_bar_1)
    (objectAtLocation soapbar_bar_2 loc_bar_tub)
    (inReceptacle toiletpaper_bar_1 toilet_bar_1)
    (objectAtLocation toiletpaper_bar_1 loc_bar_toilet)
    (canContain CabinetType SoapBarType) (canContain CabinetType ToiletPaperType)
    (canContain CounterTopType SoapBarType) (canContain CounterTopType ToiletPaperType)
    (canContain BathtubBasinType SoapBarType)
    (canContain ToiletType SoapBarType) (canContain ToiletType ToiletPaperType)
  )
  (:goal (exists (?a - object) (exists (?b - object)
           (and (not (= ?a ?b)) (objectType ?a SoapBarType) (objectType ?b SoapBarType)
                (inReceptacle ?a cabinet_bar_1) (inReceptacle ?b cabinet_bar_1)))))
)
